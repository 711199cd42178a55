"""Must-show 2: the Llama-2-7B-shaped decoder (2 layers) on a 2x4 (dp, tp) mesh, H100 preset.

The torchtitan-style layout (q/k/v, gate/up column-sharded and o/down row-sharded on tp,
batch on dp, everything else replicated) is scored by the same cost model: its parameter
and batch placements are pinned and the solver finds its cheapest execution. autoplan's
own plan must predict a step time no worse. The chosen plan is then applied on a fake
process group of 8 and runs forward and backward.
"""

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES, example_module
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

import autoplan
from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report


def llama_7b_on_cpu():
    torch.manual_seed(0)
    return example_module("llama_7b.py").build_model()


COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def torchtitan_layout(model) -> dict:
    layout = {}
    for fqn, _ in model.named_parameters():
        if any(f".{name}." in fqn for name in COLUMN):
            layout[fqn] = ("R", "S(0)")
        elif any(f".{name}." in fqn for name in ROW):
            layout[fqn] = ("R", "S(1)")
        else:
            layout[fqn] = ("R", "R")
    layout["[1]['input_ids']"] = ("S(0)", "R")
    layout["[1]['labels']"] = ("S(0)", "R")
    return layout


@pytest.fixture(scope="module")
def plans():
    loaded = load_model_file(str(EXAMPLES / "llama_7b.py"))
    auto, report = suggest_with_report(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"))
    titan, _ = suggest_with_report(
        loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), pinned=torchtitan_layout(loaded.model)
    )
    return auto, titan, report


def test_plan_is_faster_than_the_torchtitan_layout(plans):
    """The free plan beats the hand-written layout by a margin, not by construction: both are
    solved optimally on one problem, so "no slower" would always hold; 5 % faster is a
    finding of the cost model (30.9 ms against 34.5 ms with the h100-sxm profile) that a
    change to it can undo."""
    auto, titan, report = plans
    print(report.summary())
    print("torchtitan layout:", titan.predicted)
    assert titan.parameters["model.layers.0.self_attn.q_proj.weight"] == ("R", "S(0)")
    assert titan.parameters["model.layers.1.mlp.down_proj.weight"] == ("R", "S(1)")
    assert auto.predicted.step_time_s <= 0.95 * titan.predicted.step_time_s
    assert auto.parameters != titan.parameters
    assert auto.solver.status == "optimal"
    assert auto.predicted.peak_memory_bytes <= 85520809984


def test_mlp_blocks_are_megatron_style_on_one_axis(plans):
    """gate/up column-sharded and down row-sharded on the same mesh axis, in every layer.

    Which axis is a cost-model finding: both axes of a 2x4 mesh sit inside one 8-GPU
    NVLink node, and the model prices tensor parallelism of degree 2 with data
    parallelism of degree 4 a little cheaper than 4 x 2 (the cost model's alpha-beta figures per axis decide it).
    """
    auto, _, _ = plans
    for layer in (0, 1):
        mlp = f"model.layers.{layer}.mlp"
        axes = [
            a for a in range(2)
            if auto.parameters[f"{mlp}.gate_proj.weight"][a] == "S(0)"
            and auto.parameters[f"{mlp}.up_proj.weight"][a] == "S(0)"
            and auto.parameters[f"{mlp}.down_proj.weight"][a] == "S(1)"
        ]
        assert axes, auto.parameters


@pytest.mark.slow
def test_plan_runs_forward_and_backward_on_fake_process_group(plans):
    auto, _, _ = plans
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        model = autoplan.apply_plan(llama_7b_on_cpu(), auto, mesh)  # real bf16 weights, 1.3 GB
        # A short batch: the plan shards only the batch dim, so any batch divisible by the mesh works.
        batch = {
            "input_ids": torch.randint(0, 32000, (8, 16)),
            "labels": torch.randint(0, 32000, (8, 16)),
        }
        local = autoplan.shard_batch(batch, auto, mesh)
        loss = autoplan.training_loss(model(**local))
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None for g in grads)
        for fqn, param in model.named_parameters():
            assert tuple(str(p) for p in param.grad.placements) == tuple(str(p) for p in param.placements), fqn
    finally:
        dist.destroy_process_group()
