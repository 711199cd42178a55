"""One tensor dim split over several mesh axes: a parameter's FSDP storage over a
tensor-parallel split, in both orders (DTensor's default, and ``_StridedShard``, the
layout torchtitan's FSDP2-over-TP stores), from the plan format to the run."""

import json
import math

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES, example_module
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from zoo import verify_on_fake_world

import autoplan
from autoplan.cost.comm import redistribute_collectives
from autoplan.errors import PlanError
from autoplan.evaluate.baselines import build_baseline
from autoplan.pipeline.suggest import suggest_with_report
from autoplan.placements import candidate_specs, layout_problem, to_placements
from autoplan.verify.numerics import NumericsJob, build_seeded, check_numerics, seeded_batch
from autoplan.verify.observe import CollectiveCounter

LLAMA = str(EXAMPLES / "llama.py")
STRIDED = ("_S(0, 4)", "S(0)")  # dim 0 split by tp (4) first, each piece again by dp (2)


def test_storage_candidates_split_a_dim_over_both_axes_in_both_orders():
    specs = candidate_specs((64,), (2, 4), partial=False, several_axes=True)
    assert ("S(0)", "S(0)") in specs and STRIDED in specs
    assert ("S(0)", "S(0)") not in candidate_specs((64,), (2, 4), partial=False)  # a value ops compute
    assert STRIDED not in candidate_specs((12,), (2, 4), partial=False, several_axes=True)  # 12 = 3 x 4
    assert layout_problem(("_S(0, 2)", "S(0)"), (64,), (2, 4), several_axes=True) == (
        "_S(0, 2) must be followed by axes that split dim 0 2 ways (they split it 4 ways)")
    assert "does not divide into 8 pieces" in layout_problem(STRIDED, (12,), (2, 4), several_axes=True)


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


@pytest.mark.parametrize("stored, used", [
    (STRIDED, ("R", "S(0)")),  # FSDP's gather under tp: one all_gather on dp
    (("S(0)", "S(0)"), ("S(0)", "R")),
    (STRIDED, ("R", "R")),
    (("S(0)", "S(0)"), ("R", "S(0)")),  # the other order: gathered whole and sliced again
    (("P(sum)", "S(0)"), STRIDED),  # a gradient partial on dp, reduce-scattered into the storage
])
def test_moves_are_priced_as_dtensor_runs_them(fake_world, stored, used):
    weight = torch.randn(64, 8)
    if stored[0] == "P(sum)":
        value = DTensor.from_local(torch.randn(16, 8), fake_world, [Partial(), Shard(0)], run_check=False)
    else:
        value = distribute_tensor(weight, fake_world, to_placements(stored))
    with CommDebugMode() as comm:
        value.redistribute(fake_world, to_placements(used))
    ran = {str(op).rpartition(".")[2]: n for op, n in comm.get_comm_counts().items()}
    predicted = {}
    for kind, _, _, _ in redistribute_collectives(stored, used, weight.numel() * 4, (2, 4), backward=False):
        name = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}.get(kind, kind)
        predicted[name] = predicted.get(name, 0) + 1
    assert predicted == ran



@pytest.mark.parametrize("shape", [(50257, 64), (64, 64)])
def test_a_move_over_several_axes_takes_dtensors_path_for_its_sizes(fake_world, shape):
    # An output head's weight gradient, partial on tp, into its FSDP-over-TP storage. For
    # (50257, 64) DTensor first slices rows on dp, reduce-scatters half as much on tp, then
    # moves the rows to the storage on dp (rank 0 holding the larger half of the odd rows);
    # for (64, 64) it reduce-scatters the whole on tp and slices on dp.
    stored = ("_S(1, 4)", "S(1)")
    gradient = DTensor.from_local(torch.randn(shape), fake_world, [Replicate(), Partial()], run_check=False)
    with CollectiveCounter(torch.nn.Linear(1, 1), fake_world) as counter:
        gradient.redistribute(fake_world, to_placements(stored))
    ran = sorted((c.kind, c.axis, c.nbytes) for c in counter.collectives)
    predicted = redistribute_collectives(("R", "P(sum)"), stored, math.prod(shape) * 4, (2, 4), False, shape=shape)
    axes = ("dp", "tp")
    on_cpu = sorted(  # gloo has no all_to_all: DTensor all-gathers and keeps its chunk
        ("all_gather", axes[axis], round(size) * 2) if kind == "all_to_all" else (kind, axes[axis], round(size))
        for kind, axis, size, _ in predicted
    )
    assert on_cpu == ran

def test_plan_file_takes_dtensors_strided_form_and_refuses_a_wrong_factor():
    plan = build_baseline("torchtitan", *_llama(), mesh=(2, 4), profile="cpu-gloo").plan
    data = json.loads(plan.to_json())
    assert data["parameters"]["model.layers.0.self_attn.q_proj.weight"] == list(STRIDED)
    assert autoplan.Plan.from_dict(data).parameters == plan.parameters
    data["parameters"]["model.layers.0.self_attn.q_proj.weight"] = ["_S(0, 2)", "S(0)"]
    with pytest.raises(PlanError, match=r"_S\(0, 2\) must be followed by axes that split dim 0 2 ways"):
        autoplan.Plan.from_dict(data)


def test_planned_with_strided_storage_runs_its_prediction():
    """Weights pinned to FSDP-over-TP storage: the planner finds how to use them, and one
    training step runs exactly the predicted collectives (gathers on dp under the tp split,
    gradients reduce-scattered back into it)."""
    pinned = {f"model.layers.{i}.{name}.weight": STRIDED for i in (0, 1)
              for name in ("self_attn.q_proj", "mlp.gate_proj", "input_layernorm")}
    pinned["model.norm.weight"] = ("S(0)", "S(0)")
    plan, _ = suggest_with_report(*_llama(), mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo", pinned=pinned)
    for fqn, spec in pinned.items():
        assert plan.parameters[fqn] == spec
    example = example_module("llama.py")
    result = verify_on_fake_world(build_seeded(example, "build_model", 0), seeded_batch(example, 1), plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.gloo
def test_torchtitan_layout_matches_one_device_on_gloo():
    plan = build_baseline("torchtitan", *_llama(), mesh=(2, 4), profile="cpu-gloo").plan
    assert plan.parameters["lm_head.weight"] == STRIDED
    [result] = check_numerics([NumericsJob(LLAMA, "build_model", plan.to_json())], world=8)
    assert result.worst <= 1e-5, result


def _llama():
    example = example_module("llama.py")
    with torch.device("meta"):
        return example.build_model(), example.example_inputs()
