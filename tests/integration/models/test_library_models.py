"""Models as diffusers', x-transformers' and torch.nn's users build them, planned, stepped and verified.

- diffusers' DiT and Stable Diffusion UNet (``tests/models/dit.py``, ``sd_unet.py``) return
  output dataclasses that diffusers registers as pytree nodes without keys; the trace
  flattened every module's output with paths and failed ("Did not find a
  flatten_with_keys_fn for type ... Transformer2DModelOutput"). Their noise target is read
  by the loss only (``LOSS_INPUTS``): the models take no argument for it.
- x-transformers' decoder (``tests/models/x_decoder.py``) keeps each layer's norms in a
  ``ModuleList`` with ``None`` entries; repeated-block detection crashed on them
  ("'NoneType' object has no attribute 'named_parameters'"). Its targets are loss-only too.
- torch's ``nn.TransformerEncoder`` (``tests/models/torch_encoder.py``) attends with
  ``nn.MultiheadAttention``, which reads its ``out_proj``'s parameters itself, and
  unflattens its packed q/k/v projection by 3, which tp's 4 ranks cannot split.

Each is planned on 2x4 with the default budget and with one that shards weights on both
axes, and stepped on a fake process group with exactly the predicted collectives. (timm's
and open_clip's models, which import in the torch 2.14 environment only:
``test_vision_libraries.py``.)
"""

import pytest
import torch
from conftest import ROOT
from zoo import assert_step_runs_the_prediction, both_axes_plan

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import load_model_file
from autoplan.trace.repeats import find_repeated_blocks

MODELS = ROOT / "tests" / "models"
LIBRARIES = {"dit": "diffusers", "sd_unet": "diffusers", "torch_encoder": "torch", "x_decoder": "x_transformers"}
FILES = {name: MODELS / f"{name}.py" for name in LIBRARIES}

pytestmark = pytest.mark.slow  # plans whole library models


def _plan(path, memory_gib=None, cache: bool = False):
    loaded = load_model_file(str(path))
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"),
                            loss_fn=loaded.loss_fn, memory_gib=memory_gib, cache=cache)


def _sharded_on(plan, axis: int) -> list[str]:
    return [fqn for fqn, spec in plan.parameters.items() if spec[axis] != "R"]


@pytest.fixture(scope="module", params=sorted(FILES))
def model_plans(request):
    pytest.importorskip(LIBRARIES[request.param])
    path = FILES[request.param]
    # Planned through the run's plan cache (``conftest.py``: empty at the start, so this solves):
    # ``both_axes_plan`` starts from the same default-budget question, answered from the cache
    # rather than solved a second time.
    default = _plan(path, cache=True)
    return path, default, both_axes_plan(str(path))


def test_repeated_blocks_are_found_past_lists_with_empty_slots():
    pytest.importorskip("x_transformers")
    decoder = load_model_file(str(FILES["x_decoder"])).model
    assert any(None in list(m) for m in decoder.modules() if isinstance(m, torch.nn.ModuleList))
    # its layers alternate attention and feed-forward: no stack of one kind, and no crash
    assert find_repeated_blocks(decoder) is None
    encoder = load_model_file(str(FILES["torch_encoder"])).model
    blocks = find_repeated_blocks(encoder)
    assert blocks is not None and (blocks.fqn, blocks.count) == ("encoder.layers", 3)


def test_the_sharding_budget_splits_weights_on_both_axes(model_plans):
    _, _, forced = model_plans
    assert _sharded_on(forced, 0) and _sharded_on(forced, 1), forced.parameters


def test_the_loss_only_input_is_laid_out_for_the_loss(model_plans):
    path, default, forced = model_plans
    key = load_model_file(str(path)).loss_fn.inputs[0]
    for plan in (default, forced):
        assert f"[1]['{key}']" in plan.inputs  # a batch input of the step, sliced by shard_batch


def test_a_step_of_the_default_plan_runs_the_predicted_collectives(model_plans):
    path, default, _ = model_plans
    assert_step_runs_the_prediction(path, "build_model", default)


def test_a_step_of_the_sharded_plan_runs_the_predicted_collectives(model_plans):
    path, _, forced = model_plans
    assert_step_runs_the_prediction(path, "build_model", forced)


def test_a_plan_made_in_this_process_compiles_on_the_users_process_group():
    """``suggest`` prices a plan by a dry run on a fake process group of its own. DTensor's
    sharding decisions made there were cached on that group's mesh, which compares equal to
    the user's; a step compiled later in the process was answered from that cache and ran
    on the dry run's torn-down groups: "Group ... is not registered" (DiT's forced plan,
    2.13 and 2.14; every open_clip ViT row on 2.14). The compiled step runs the predicted
    collectives and gives the eager step's loss."""
    pytest.importorskip("diffusers")
    from zoo import fake_world_mesh

    from autoplan.model_file import import_model_file, loss_function
    from autoplan.verify.numerics import build_seeded, seeded_batch, without_randomness
    from autoplan.verify.step_check import verify_plan

    path = FILES["dit"]
    try:
        _plan(path, memory_gib=1e-12)
    except InfeasibleError as err:
        least = err.smallest_bytes
    state = 4 * sum(p.numel() * p.element_size() for p in load_model_file(str(path)).model.parameters())
    plan = _plan(path, memory_gib=(least + state / 64) / 2**30)  # weights split on both axes
    assert _sharded_on(plan, 0) and _sharded_on(plan, 1), plan.parameters
    module = import_model_file(path)
    loss_fn = loss_function(module, path)
    with fake_world_mesh(plan) as mesh, without_randomness():
        eager = verify_plan(build_seeded(module, "build_model", 0), seeded_batch(module, 1), plan, mesh, loss_fn=loss_fn)
        torch._dynamo.reset()
        compiled = verify_plan(build_seeded(module, "build_model", 0), seeded_batch(module, 1), plan, mesh,
                               loss_fn=loss_fn, compile_mode="whole", backend="aot_eager")
    assert compiled.passed, "\n" + compiled.summary()
    assert abs(compiled.loss - eager.loss) <= 1e-5 * abs(eager.loss), (compiled.loss, eager.loss)
