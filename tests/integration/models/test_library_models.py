"""Models as diffusers' and x-transformers' users build them, planned, stepped and verified.

- diffusers' DiT and Stable Diffusion UNet (``tests/models/dit.py``, ``sd_unet.py``) return
  output dataclasses that diffusers registers as pytree nodes without keys; the trace
  flattened every module's output with paths and failed ("Did not find a
  flatten_with_keys_fn for type ... Transformer2DModelOutput"). Their noise target is read
  by the loss only (``LOSS_INPUTS``): the models take no argument for it.
- x-transformers' decoder (``tests/models/x_decoder.py``) keeps each layer's norms in a
  ``ModuleList`` with ``None`` entries; repeated-block detection crashed on them
  ("'NoneType' object has no attribute 'named_parameters'"). Its targets are loss-only too.

Each is planned on 2x4 with the default budget and with one that shards weights on both
axes, stepped on a fake process group with exactly the predicted collectives, and the
sharded plan's loss and gradients match one device on 8 gloo processes.
"""

import pytest
from conftest import ROOT
from zoo import assert_matches_one_device, assert_step_runs_the_prediction, forced_plan

import autoplan
from autoplan.model_file import load_model_file

pytest.importorskip("diffusers")
pytest.importorskip("x_transformers")

MODELS = ROOT / "tests" / "models"
FILES = {name: MODELS / f"{name}.py" for name in ("dit", "sd_unet", "x_decoder")}

pytestmark = pytest.mark.slow  # plans whole library models


def _default_plan(path):
    loaded = load_model_file(str(path))
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"),
                            loss_fn=loaded.loss_fn, cache=False)


@pytest.fixture(scope="module", params=sorted(FILES))
def model_plans(request):
    path = FILES[request.param]
    return path, _default_plan(path), forced_plan(str(path))


def _sharded_on(plan, axis: int) -> list[str]:
    return [fqn for fqn, spec in plan.parameters.items() if spec[axis] != "R"]


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


@pytest.mark.gloo
def test_the_sharded_plan_matches_one_device(model_plans):
    path, _, forced = model_plans
    assert_matches_one_device(path, "build_model", forced)
