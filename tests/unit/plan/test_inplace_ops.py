"""In-place ops (``dtensor/strategies.py``, ``plan/builder.py``): DTensor runs an in-place op where
its self is and gives self back, so every candidate takes self as it is, in any layout (a
MoE router divides its replicated top-k weights in place); a plan that would move self
anyway says so in its warnings."""

import torch
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.plan.builder import _moved_inplace_selves
from autoplan.trace.tracer import trace_model


class NormalisedRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, x):
        weights = self.proj(x).softmax(-1)
        weights /= weights.sum(-1, keepdim=True)
        return weights.sum()


def _division():
    choices = build_choices(trace_model(NormalisedRows(), (torch.randn(4, 16),)), (2, 4), ("dp", "tp"))
    name = next(d.name for d in choices.graph.decisions() if d.fx_node.target == torch.ops.aten.div_.Tensor)
    return choices, name


def test_every_candidate_takes_self_as_it_is_in_any_layout():
    choices, name = _division()
    strategies = choices.decision(name).strategies
    assert all(s.outputs[0] == s.inputs[0] for s in strategies)
    assert {("R", "R"), ("S(0)", "R"), ("R", "S(0)")} <= {s.inputs[0] for s in strategies}


def test_a_plan_that_moves_self_says_so():
    choices, name = _division()
    graph = choices.graph
    source = next(u for u, _, k in graph.inputs_of(name) if k == 0)
    choice = dict.fromkeys(graph.nodes, 0)
    made = graph.decision(source).strategies[0].outputs[0]
    strategies = graph.decision(name).strategies
    choice[name] = next(i for i, s in enumerate(strategies) if s.inputs[0] == made)
    assert not _moved_inplace_selves(graph, choice)
    choice[name] = next(i for i, s in enumerate(strategies) if s.inputs[0] != made)
    warnings = _moved_inplace_selves(graph, choice)
    assert len(warnings) == 1 and name in warnings[0] and "in-place" in warnings[0]


class NormedWidth(nn.Module):
    """``nn.RMSNorm`` between two projections: on the CPU ``F.rms_norm`` decomposes into a
    mean and an in-place ``add_`` of eps, which DTensor runs only on self as it was made."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.norm = nn.RMSNorm(64)
        self.down = nn.Linear(64, 8)

    def forward(self, x):
        return self.down(self.norm(self.up(x))).sum()


def test_an_in_place_op_is_never_handed_a_self_it_must_move():
    """``add_`` follows the mean it adds eps to; every leader strategy the pins leave hands
    it its self as it reads it, and some other would not (the mean partial where the width
    is split: DTensor fails with "in-place operations that require placement changes")."""
    from zoo import verify_on_fake_world

    from autoplan.pipeline.pinning import Pins
    from autoplan.pipeline.problem import prepare_problem, solve_problem

    torch.manual_seed(0)
    model, batch = NormedWidth(), (torch.randn(8, 16),)
    problem = prepare_problem(model, batch, (2, 4), ("dp", "tp"), "cpu-gloo")
    graph, simplified = problem.choices.graph, problem.simplified
    name = next(d.name for d in graph.decisions() if d.fx_node.target == torch.ops.aten.add_.Scalar)
    leader, pick = simplified.followers[name]
    [(source, out_index, _)] = graph.inputs_of(name)

    def as_read(i: int) -> bool:
        return simplified.output_under_leader(source, out_index, i) == graph.decision(name).strategies[pick[i]].inputs[0]

    pins = Pins(problem)
    runnable = {i for i in range(len(pick)) if as_read(i)}
    assert pins.allowed[problem.twins.get(leader, leader)] == runnable != set(range(len(pick)))
    plan, _, _ = solve_problem(problem, pins)
    assert not [w for w in plan.warnings if "in-place" in w], plan.warnings
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
