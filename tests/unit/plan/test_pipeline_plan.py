"""The pipeline part of a plan (``plan/pipeline_plan.py``): its JSON round trip and the
checks a schema cannot make."""

import copy

import pytest
import torch
from torch import nn

import autoplan
from autoplan.errors import PlanError
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import PipelinePlan


@pytest.fixture(scope="module")
def stage_plan() -> dict:
    """A layout on a 2-device stage mesh of a four-layer model (no stages yet)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 8))
        inputs = (torch.randn(4, 8),)
    return autoplan.suggest(model, inputs, mesh=(2,), axis_names=("tp",), cache=False, profile="cpu-gloo").to_dict()


def pipelined(data: dict, **changes) -> dict:
    data = copy.deepcopy(data)
    data["pipeline"] = {
        "axis": "pp", "size": 2, "axis_index": 0, "schedule": "1F1B", "microbatches": 4, "bubble_share": 0.2,
        "stages": [{"modules": ["0", "1", "2"], "rank": 0, "forward_s": 1e-3, "backward_s": 2e-3, "peak_memory_bytes": 10},
                   {"modules": ["3"], "rank": 1}],
    } | changes
    return data


def test_a_plan_without_stages_writes_no_pipeline_key(stage_plan):
    assert "pipeline" not in stage_plan
    assert Plan.from_dict(stage_plan).pipeline is None


def test_stages_round_trip_and_name_the_full_mesh(stage_plan):
    plan = Plan.from_dict(pipelined(stage_plan))
    assert Plan.from_dict(plan.to_dict()).to_json() == plan.to_json()
    pipeline = plan.pipeline
    assert isinstance(pipeline, PipelinePlan) and pipeline.virtual == 1
    assert pipeline.full_mesh(plan.mesh_shape, plan.axis_names) == ((2, 2), ("pp", "tp"))
    assert pipeline.stages_of(1) == (1,) and pipeline.stages[0].modules == ("0", "1", "2")


def test_alternatives_round_trip(stage_plan):
    alternatives = [{"mesh": "pp 4 x tp 2", "stages": 4, "schedule": "1F1B", "microbatches": 8, "step_time_s": 0.5,
                     "peak_memory_bytes": 12, "fits": False}]
    plan = Plan.from_dict(pipelined(stage_plan, alternatives=alternatives))
    assert plan.pipeline.alternatives[0].stages == 4 and not plan.pipeline.alternatives[0].fits
    assert plan.to_dict()["pipeline"]["alternatives"] == alternatives
    assert "alternatives" not in Plan.from_dict(pipelined(stage_plan)).to_dict()["pipeline"]


def test_interleaved_stages_go_round_the_ranks(stage_plan):
    stages = [{"modules": [m], "rank": i % 2} for i, m in enumerate(["0", "1", "2", "3"])]
    plan = Plan.from_dict(pipelined(stage_plan, schedule="Interleaved1F1B", stages=stages))
    assert plan.pipeline.virtual == 2 and plan.pipeline.stages_of(0) == (0, 2)


@pytest.mark.parametrize("changes,words", [
    ({"axis": "tp"}, "also a layout axis"),
    ({"axis_index": 3}, "outside the 2-axis mesh"),
    ({"stages": [{"modules": ["0", "1", "2", "3"], "rank": 0}]}, "not a multiple of its size 2"),
    ({"stages": [{"modules": ["0", "1"], "rank": 0}, {"modules": ["2"], "rank": 1}]}, "parameter 3.bias lies under no stage"),
    ({"stages": [{"modules": ["0", "2"], "rank": 0}, {"modules": ["2", "3"], "rank": 1}]}, "module '2' is in stages 0 and 1"),
    ({"stages": [{"modules": ["0", "2"], "rank": 0}, {"modules": ["3"], "rank": 0}]}, "do not give each of the 2 ranks"),
    ({"stages": [{"modules": [m], "rank": i % 2} for i, m in enumerate("0123")]}, "runs one stage per rank"),
    ({"schedule": "Zigzag"}, "schedule"),
    ({"microbatches": 0}, "microbatches"),
])
def test_a_wrong_pipeline_is_one_plan_error_line(stage_plan, changes, words):
    with pytest.raises(PlanError) as err:
        Plan.from_dict(pipelined(stage_plan, **changes), source="p.json")
    assert words in str(err.value) and "p.json" in str(err.value) and "\n" not in str(err.value)
