"""Which traced values carry a gradient (``choices/graph.py``) and which ops DTensor runs
pointwise (``dtensor/strategies.py``): the collectives a plan predicts for the backward
follow from both (``plan/collectives.py``)."""

import torch
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.dtensor.strategies import is_pointwise
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten


class DroppedProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.proj(x)).sum()


def test_a_dropout_mask_carries_no_gradient():
    # Dropout traces as empty_like(x).bernoulli_(p).div_(p) times x: the mask reads x for its
    # shape only, so no gradient goes back through it (a plan once gathered one that never ran).
    choices = build_choices(trace_model(DroppedProjection().train(), (torch.randn(4, 16),)), (2, 4), ("dp", "tp"))
    by_target = {}
    for decision in choices.graph.decisions():
        by_target.setdefault(decision.fx_node.target, []).append(decision)
    mask_ops = [aten.empty_like.default, aten.bernoulli_.float, aten.div_.Scalar]
    assert all(op in by_target for op in mask_ops), sorted(map(str, by_target))
    assert not any(d.requires_grad for op in mask_ops for d in by_target[op])
    assert all(d.requires_grad for d in by_target[aten.mul.Tensor])  # the projection times the mask


def test_ops_with_partial_rules_of_their_own_are_pointwise():
    # Newer torch registers neg, mul, add and div apart from its pointwise list; their
    # backward runs split all the same (a rotary embedding's negated half).
    for op in (aten.neg.default, aten.mul.Tensor, aten.add.Tensor, aten.div_.Scalar, aten.silu.default):
        assert is_pointwise(op), op
    for op in (aten.slice.Tensor, aten.cat.default, aten.mm.default, aten.sum.dim_IntList):
        assert not is_pointwise(op), op
