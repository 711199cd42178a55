"""Gradients of operands an op broadcast: autograd sums the output's gradient over the
broadcast dims, so the rule that hands a gradient on as it comes must not cover them
(``plan/gradient_rules.py``).

- DeepSeek-V4's hyper-connection splits its learned bias in parts and adds each to a
  slice of a projection split by batch: each part's gradient is partial there, and the
  prediction handed it on split by batch (the split's outputs are getitems, which the
  planning graph has no decision of, so the parts were taken for values without a
  gradient and the add for one of operands of its own shape)."""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from autoplan.choices.graph import build_choices
from autoplan.plan.gradient_rules import passes_gradient, passes_gradient_to
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten
BY_BATCH = "S(0)"


class SplitBias(nn.Module):
    """A learned bias in two parts, each added to its slice of a projection, scaled."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 8, bias=False)
        self.base = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        a, b = self.proj(x).split(4, dim=-1)
        bias_a, bias_b = self.base.split(4)
        return (torch.sigmoid(2 * a + bias_a) * torch.sigmoid(2 * b + bias_b)).sum()


def _graph(model, *inputs):
    return build_choices(trace_model(model, inputs), (2, 4), ("dp", "tp")).graph


def test_an_add_of_a_split_bias_part_sums_its_gradient():
    graph = _graph(SplitBias(), torch.randn(8, 12, 16))
    adds = [d.name for d in graph.decisions() if d.fx_node is not None and d.fx_node.target is aten.add.Tensor]
    assert len(adds) == 2
    for add in adds:
        assert not passes_gradient(graph, add)
        assert passes_gradient_to(graph, add, 0) and not passes_gradient_to(graph, add, 1)


def test_dtensor_hands_a_bias_part_added_to_a_batch_split_a_partial_gradient(fake_mesh_2x4):
    x = DTensor.from_local(torch.randn(2, 4), fake_mesh_2x4, (Replicate(), Shard(0)))
    base = DTensor.from_local(torch.zeros(4), fake_mesh_2x4, (Replicate(), Replicate())).requires_grad_()
    (part,) = base.split(4)
    (grad,) = torch.autograd.grad(torch.sigmoid(x + part).sum(), part)
    assert grad.placements == (Replicate(), Partial("sum"))
