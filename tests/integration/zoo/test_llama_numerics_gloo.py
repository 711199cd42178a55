"""Must-show 3: numerics on 8 gloo processes (127.0.0.1) against the single-device model.

The tiny Llama is planned with a memory budget small enough that weights must be sharded
on both mesh axes; every rank then applies the plan, feeds its slice of the global batch,
and its loss and every parameter gradient must equal the single-device model's
(max|g - g_ref| / max|g_ref| <= 1e-5, float32).
"""

import copy
import json

import pytest
import torch
from conftest import example_module

import autoplan
from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks

WORLD = 8
TOLERANCE = 1e-5
BUDGET_GIB = 0.0015  # 1.5 MiB: the replicated model state alone needs about 2 MiB


def worker(rank: int, plan_json: str, port: int, result_path: str):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # eight processes share few cores
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD):
        plan = autoplan.Plan.from_dict(json.loads(plan_json))
        example = example_module("llama.py")
        torch.manual_seed(0)
        model = example.build_model()
        reference = copy.deepcopy(model)
        torch.manual_seed(1)
        batch = example.example_inputs()
        mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
        autoplan.apply_plan(model, plan, mesh)
        loss = autoplan.training_loss(model(**autoplan.shard_batch(batch, plan, mesh)))
        loss.backward()
        ref_loss = autoplan.training_loss(reference(**batch))
        ref_loss.backward()
        errors = {"loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())}
        ref_params = dict(reference.named_parameters())
        for fqn, param in model.named_parameters():
            grad = param.grad.full_tensor()
            ref = ref_params[fqn].grad
            errors[fqn] = ((grad - ref).abs().max() / ref.abs().max()).item()
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(errors, f)
        bad = {k: v for k, v in errors.items() if not v <= TOLERANCE}
        assert not bad, f"rank {rank}: relative errors above {TOLERANCE}: {bad}"


@pytest.mark.gloo
def test_loss_and_gradients_match_single_device(tmp_path):
    example = example_module("llama.py")
    with torch.device("meta"):
        model = example.build_model()
        batch = example.example_inputs()
    plan = autoplan.suggest(model, batch, mesh=(2, 4), axis_names=("dp", "tp"), memory_gib=BUDGET_GIB)
    sharded_axes = {axis for spec in plan.parameters.values() for axis, p in enumerate(spec) if p.startswith("S(")}
    assert sharded_axes == {0, 1}, plan.parameters
    result = tmp_path / "errors.json"
    start_ranks(worker, (plan.to_json(), free_port(), str(result)), nprocs=WORLD)
    errors = json.loads(result.read_text())
    assert len(errors) == 1 + len(plan.parameters)
    assert max(errors.values()) <= TOLERANCE
