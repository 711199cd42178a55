"""``plan/expert_parallel.py``: which modules are experts, and a plan laid out expert parallel."""

import json

import pytest
import torch
from torch import nn

from autoplan.errors import PlanError
from autoplan.plan.expert_parallel import (
    GROUPED,
    ROUTED,
    even_load_all_to_all_bytes,
    find_experts,
    with_expert_parallel,
)
from autoplan.plan.module_plan import ModuleLayout, Plan, Predicted, SolverReport


class RoutedExperts(nn.Module):
    """Written as transformers writes its experts: 3-D weights, (tokens, top-k index, top-k weights)."""

    def __init__(self, experts=8, width=4, inner=6):
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inner, width))
        self.down_proj = nn.Parameter(torch.randn(experts, width, inner))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return hidden_states


class GroupedExperts(nn.Module):
    """Written as torchtitan writes its experts: (tokens sorted by expert, tokens per expert)."""

    def __init__(self, experts=8):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, 6, 4))
        self.w2 = nn.Parameter(torch.randn(experts, 4, 6))

    def forward(self, x, num_tokens_per_expert):
        return x


class Caller(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = GroupedExperts()

    def forward(self, x, scores, ids, counts):
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)  # 2-D: not experts
        self.moe = RoutedExperts()
        self.routed = Caller()
        self.uneven = nn.Module()
        self.uneven.a = nn.Parameter(torch.randn(8, 2, 2))
        self.uneven.b = nn.Parameter(torch.randn(4, 2, 2))  # two leading sizes: not experts


def _plan(model, mesh=(2, 4), names=("dp", "ep")) -> Plan:
    replicated = ("R",) * len(mesh)
    return Plan(
        mesh_shape=mesh, axis_names=names,
        parameters={fqn: replicated for fqn, _ in model.named_parameters()},
        modules={"moe": ModuleLayout({"[0]": ("S(0)", "R")}, {"": ("S(0)", "R")}), "proj": ModuleLayout()},
        inputs={},
        predicted=Predicted(1.0, 0.5, 0.5, 10, 5, 5),
        profile="cpu-gloo", fingerprint="x", solver=SolverReport("OPTIMAL", 1.0, 1.0, 0.0),
        opaque_modules=("routed.experts",),
        parameter_uses={"moe.down_proj": ("R", "R")},
        parameter_shapes={fqn: tuple(p.shape) for fqn, p in model.named_parameters()},
    )


def test_experts_are_found_by_their_parameters_and_call():
    found = {e.fqn: (e.experts, e.call) for e in find_experts(Model())}
    assert found == {"moe": (8, ROUTED), "routed.experts": (8, GROUPED)}


def test_a_plan_laid_out_expert_parallel_splits_the_experts_on_the_axis():
    model = Model()
    plan = with_expert_parallel(_plan(model), model, "ep")
    assert plan.expert_parallel == {
        "moe": {"axis": "ep", "experts": 8, "call": ROUTED},
        "routed.experts": {"axis": "ep", "experts": 8, "call": GROUPED},
    }
    for fqn in ("moe.gate_up_proj", "moe.down_proj", "routed.experts.w1", "routed.experts.w2"):
        assert plan.parameters[fqn] == ("R", "S(0)")
    assert plan.parameters["proj.weight"] == ("R", "R")
    assert "moe" not in plan.modules and "proj" in plan.modules  # the engine lays out the experts' tokens itself
    assert plan.opaque_modules == () and plan.parameter_uses == {}
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.expert_parallel == plan.expert_parallel and again.to_json() == plan.to_json()


def test_a_plan_without_experts_keeps_its_bytes():
    model = Model()
    data = _plan(model).to_dict()
    assert "expert_parallel" not in data


def test_a_bad_expert_layout_is_one_clear_error():
    model = Model()
    with pytest.raises(PlanError, match="cannot split evenly"):
        with_expert_parallel(_plan(model, (2, 3)), model, "ep")
    with pytest.raises(PlanError, match="mesh has axes"):
        with_expert_parallel(_plan(model), model, "tp")
    with pytest.raises(PlanError, match="no experts module"):
        with_expert_parallel(_plan(nn.Linear(2, 2)), nn.Linear(2, 2), "ep")


def test_a_plan_file_with_a_wrong_expert_layout_is_refused():
    model = Model()
    data = json.loads(with_expert_parallel(_plan(model), model, "ep").to_json())
    data["expert_parallel"]["moe"]["call"] = "looped"
    with pytest.raises(PlanError):
        Plan.from_dict(data)
    data["expert_parallel"]["moe"].update(call="routed", axis="tp")
    with pytest.raises(PlanError, match="expert_parallel"):
        Plan.from_dict(data)


def test_the_even_load_price_sends_all_but_ones_own_share():
    # 16 tokens, each to 2 experts, 64 float32 values, 4 ranks: 3/4 of 8 KiB leave the rank
    assert even_load_all_to_all_bytes(16, 2, 64, 4, 4) == 16 * 2 * 64 * 4 * 3 / 4
    assert even_load_all_to_all_bytes(16, 2, 64, 4, 1) == 0


def test_export_refuses_an_expert_parallel_plan_in_one_line(tmp_path, capsys):
    from autoplan.cli import main

    model = Model()
    path = with_expert_parallel(_plan(model), model, "ep").save(tmp_path / "plan.json")
    status = main(["export", str(path), "--format", "torch", "--out", str(tmp_path / "out.py")])
    lines = capsys.readouterr().err.splitlines()
    assert status != 0 and len(lines) == 1 and "splits its experts over ep (expert parallel)" in lines[0], lines
    assert not (tmp_path / "out.py").exists()
