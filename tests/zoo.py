"""The public zoo the zoo tests run: example model files, meshes, and a sharding-forcing budget."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from conftest import EXAMPLES

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import load_model_file

PUBLIC_ZOO = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama")
"""examples/<name>.py: MLP, CNN with BatchNorm, torch's test Transformer, GPT-2, BERT, Llama (GQA)."""
HARD_CASES = ("llama_uneven", "moe")
MESHES = {(8,): ("dp",), (2, 4): ("dp", "tp"), (2, 2, 2): ("node", "dp", "tp")}  # "pp" would make a pipeline axis


def example_path(name: str) -> str:
    return str(EXAMPLES / f"{name}.py")


def sharding_budget_gib(plan) -> float:
    """A budget that the unconstrained plan exceeds: half its model state must be sharded away."""
    predicted = plan.predicted
    return (predicted.peak_memory_bytes - 0.5 * predicted.model_state_bytes) / 2**30


def forced_plan(path: str, mesh=(2, 4), axis_names=("dp", "tp"), profile=None):
    """The plan under ``sharding_budget_gib``; where no plan gets that low, under a budget
    halfway between the least any plan needs and the unconstrained peak. Where that plan
    meets its budget by splitting activations alone (a CNN's activations dwarf its
    weights), ``weight_sharding_plan``. For the model file's ``compute_loss`` where it defines one."""

    def suggest(memory_gib=None):
        loaded = load_model_file(path)
        return autoplan.suggest(
            loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names, profile=profile,
            memory_gib=memory_gib, loss_fn=loaded.loss_fn,
        )

    free = suggest()
    try:
        plan = suggest(sharding_budget_gib(free))
    except InfeasibleError as err:
        plan = suggest((err.smallest_bytes + free.predicted.peak_memory_bytes) / 2 / 2**30)
    if any(p != "R" for spec in plan.parameters.values() for p in spec):
        return plan
    return weight_sharding_plan(path, mesh, axis_names, profile, free)


def weight_sharding_plan(path: str, mesh=(2, 4), axis_names=("dp", "tp"), profile=None, free=None):
    """The plan under the least memory any plan needs plus 40 % of the model state: a plan
    that keeps every weight whole holds all of it (the least holds at most an eighth on 8
    devices), so weights must be sharded whatever the activations weigh. ``free``: the
    unconstrained plan, where the caller has it. For the model file's ``compute_loss``."""

    def suggest(memory_gib=None):
        loaded = load_model_file(path)
        return autoplan.suggest(
            loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names, profile=profile,
            memory_gib=memory_gib, loss_fn=loaded.loss_fn,
        )

    if free is None:
        free = suggest()
    try:
        suggest(1e-12)
    except InfeasibleError as err:
        least = err.smallest_bytes
    else:
        raise AssertionError("a plan fitting 1e-12 GiB per device")
    return suggest((least + 0.4 * free.predicted.model_state_bytes) / 2**30)


def mean_loss_splits_over_the_batch() -> bool:
    """Whether DTensor's registry (read as the planner reads it) runs a mean ``nll_loss`` on
    targets split over the batch. torch 2.13's rule does (the loss partial, averaged); 2.14's
    keeps a batch split for the ``none`` and ``sum`` reductions only, so a mean loss takes
    its logits with the batch whole."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoplan.choices.graph import planning_mesh
    from autoplan.dtensor.overrides import while_installed
    from autoplan.dtensor.strategies import enumerate_strategies
    from autoplan.placements import shard

    nll_loss = torch.ops.aten.nll_loss_forward.default
    with FakeTensorMode():
        args = (torch.randn(8, 16), torch.randint(0, 16, (8,)), None, 1, -100)  # reduction 1: mean
        out = nll_loss(*args)
    mesh = planning_mesh((2, 4), ("dp", "tp"))
    found = while_installed(enumerate_strategies)(nll_loss, args, {}, out, mesh)
    return any(shard(0) in strategy.inputs[1] for strategy in found)


def both_axes_plan(path: str, mesh=(2, 4), axis_names=("dp", "tp")):
    """``forced_plan``; where that one shards weights on one mesh axis only (x-transformers'
    decoder, open_clip's CLIP: tp), the plan under the least memory any plan takes plus a
    tenth of the model state, which shards them on both."""
    plan = forced_plan(path, mesh, axis_names)
    if all(any(spec[axis] != "R" for spec in plan.parameters.values()) for axis in range(len(mesh))):
        return plan

    def suggest(memory_gib=None):
        loaded = load_model_file(path)
        return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names,
                                memory_gib=memory_gib, loss_fn=loaded.loss_fn)

    free = suggest()
    try:
        suggest(1e-12)
    except InfeasibleError as err:
        return suggest((err.smallest_bytes + 0.1 * free.predicted.model_state_bytes) / 2**30)
    raise AssertionError("a plan fitting 1e-12 GiB per device")


@contextmanager
def fake_world_mesh(plan):
    """A fake process group of the plan's world size (this process is rank 0) and its mesh,
    for the ``with`` body, as ``autoplan verify`` sets it up."""
    from autoplan.verify.fake_world import fake_world

    with fake_world(plan.mesh_shape, plan.axis_names) as mesh:
        yield mesh


def verify_on_fake_world(model, batch, plan, loss_fn=None, tensors: str = "real"):
    """``verify_plan`` of one training step (with ``loss_fn``'s loss) on a fake process group
    of the plan's mesh, on real or fake ``tensors``."""
    from autoplan.verify.step_check import verify_plan

    with fake_world_mesh(plan) as mesh:
        return verify_plan(model, batch, plan, mesh, loss_fn=loss_fn, tensors=tensors)


def assert_step_runs_the_prediction(model_file, build_name: str, plan) -> None:
    """One training step of ``plan`` on a fake process group runs exactly its predicted
    collectives; with the model file's ``compute_loss`` where it defines one, as the
    numerics check (``assert_matches_one_device``) takes it."""
    from autoplan.model_file import import_model_file, loss_function
    from autoplan.verify.numerics import build_seeded, seeded_batch

    module = import_model_file(Path(model_file))
    loss_fn = loss_function(module, Path(model_file))
    result = verify_on_fake_world(build_seeded(module, build_name, 0), seeded_batch(module, 1), plan, loss_fn)
    assert result.passed, "\n" + result.summary()


def assert_matches_one_device(model_file, build_name: str, plan, tolerance: float = 1e-5) -> None:
    """Loss and every gradient of one step of ``plan`` on 8 gloo processes within ``tolerance``
    (relative) of the model on one device."""
    from autoplan.verify.numerics import NumericsJob, check_numerics

    [result] = check_numerics([NumericsJob(str(model_file), build_name, plan.to_json())], world=8)
    assert result.loss <= tolerance, result.loss
    worst = max(result.gradients.items(), key=lambda item: item[1])
    assert worst[1] <= tolerance, worst
