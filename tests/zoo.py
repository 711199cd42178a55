"""The public zoo the zoo tests run: example model files, meshes, and a sharding-forcing budget."""

from __future__ import annotations

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import load_model_file
from conftest import EXAMPLES

PUBLIC_ZOO = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama")
"""examples/<name>.py: MLP, CNN with BatchNorm, torch's test Transformer, GPT-2, BERT, Llama (GQA)."""
HARD_CASES = ("llama_uneven", "moe")
MESHES = {(8,): ("dp",), (2, 4): ("dp", "tp"), (2, 2, 2): ("pp", "dp", "tp")}


def example_path(name: str) -> str:
    return str(EXAMPLES / f"{name}.py")


def sharding_budget_gb(plan) -> float:
    """A budget that the unconstrained plan exceeds: half its model state must be sharded away."""
    predicted = plan.predicted
    return (predicted.peak_memory_bytes - 0.5 * predicted.model_state_bytes) / 2**30


def forced_plan(path: str, mesh=(2, 4), axis_names=("dp", "tp"), profile=None):
    """The plan under ``sharding_budget_gb``; where no plan gets that low, under a budget
    halfway between the least any plan needs and the unconstrained peak. For the model
    file's ``compute_loss`` where it defines one."""
    loaded = load_model_file(path)
    free = autoplan.suggest(
        loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names, profile=profile, loss_fn=loaded.loss_fn
    )
    loaded = load_model_file(path)
    try:
        return autoplan.suggest(
            loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names, profile=profile,
            memory_gb=sharding_budget_gb(free), loss_fn=loaded.loss_fn,
        )
    except InfeasibleError as err:
        budget = (err.smallest_bytes + free.predicted.peak_memory_bytes) / 2 / 2**30
        return autoplan.suggest(
            loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names, profile=profile, memory_gb=budget,
            loss_fn=loaded.loss_fn,
        )


def verify_on_fake_world(model, batch, plan):
    """``verify_plan`` of one training step on a fake process group of the plan's mesh."""
    import math

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.verify.step_check import verify_plan

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(plan.mesh_shape))
    try:
        mesh = init_device_mesh("cpu", tuple(plan.mesh_shape), mesh_dim_names=tuple(plan.axis_names))
        return verify_plan(model, batch, plan, mesh)
    finally:
        dist.destroy_process_group()
