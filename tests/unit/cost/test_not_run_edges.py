"""Edge pairs DTensor never runs are priced out (``cost._not_run``).

DTensor picks an op's strategy by the cost of the moves it needs: where the value
arrives split on the batch and the op can take it so (RMSNorm's ``weight * x``), it
does not gather it first, whatever the plan says. The Llama example's plan once
gathered the normalised activations inside the norm (one gather priced per read was
dearer than gathering at the op); the run skipped it, gathered at the module boundary
instead, and computed the weight's gradient batch-split: a partial gradient, an
all_reduce the plan never predicted. Within a module such a pair costs ``NOT_RUN_S``
more; across a module boundary the hook moves the value as planned and it costs no more.
"""

import torch
from test_mlp_optimum import exact_profile
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.cost.edges import NOT_RUN_S
from autoplan.cost.estimate import estimate_costs
from autoplan.trace.tracer import trace_model


class Scale(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return torch.relu(x) * self.weight  # relu -> mul inside one module


class Outer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.scale = Scale(width)

    def forward(self, x):
        return self.scale(torch.relu(x)).sum()  # relu (root) -> relu (scale): enters a module


def _edges(costed, target):
    graph = costed.choices.graph
    for (u, v, _k), edge in costed.edges.items():
        consumer = graph.decision(v)
        if consumer.kind == "op" and consumer.fx_node.target == target and graph.decision(u).kind == "op":
            yield u, v, edge


def _cost(edge, src, dst):
    return edge.seconds[edge.rows.index(src)][edge.cols.index(dst)]


def test_gathering_what_the_op_takes_split_is_priced_out_inside_a_module_only():
    with torch.device("meta"):
        model, x = Outer(64), torch.randn(8, 64)
    costed = estimate_costs(build_choices(trace_model(model, (x,)), (8,), ("dp",)), exact_profile())
    owners = costed.choices.traced.node_modules

    (_, _, inside), = list(_edges(costed, torch.ops.aten.mul.Tensor))
    # x arrives split on the batch: the mul takes it so (weight replicated) at no cost,
    # so DTensor never gathers it for the mul's all-replicated strategy.
    assert _cost(inside, ("S(0)",), ("R",)) >= NOT_RUN_S
    assert _cost(inside, ("S(0)",), ("S(0)",)) == 0.0
    assert _cost(inside, ("R",), ("S(0)",)) == 0.0  # a slice: nothing to price out

    entering = [e for u, v, e in _edges(costed, torch.ops.aten.relu.default) if owners.get(v) == "scale"]
    (edge,) = entering  # the scale module's input hook gathers it as planned
    assert 0.0 < _cost(edge, ("S(0)",), ("R",)) < NOT_RUN_S
