"""A tensor the forward makes a leaf that needs a gradient (``trace/grad_leaves.py``): the
backward reaches it through what reads it, and nothing through what it was made from."""

import torch
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.plan.reached import reached_by_backward
from autoplan.trace.tracer import trace_model


class AttentionWithoutKernel(nn.Module):
    """What MRA's attention returns where its kernel is missing: zeros shaped like the query,
    made to need a gradient, projected out."""

    def __init__(self):
        super().__init__()
        self.query = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        context = torch.zeros_like(self.query(x)).requires_grad_()
        return self.out(context * 2)


def test_the_backward_reaches_a_leaf_the_forward_made_and_stops_there():
    with torch.device("meta"):
        traced = trace_model(AttentionWithoutKernel(), (torch.randn(4, 16),), loss_fn=lambda out, batch: out.sum())
    nodes = {node.name: node for node in traced.graph_module.graph.nodes}
    (leaf,) = traced.grad_leaves
    assert "zeros_like" in str(nodes[leaf].target)
    choices = build_choices(traced, (2, 4), ("dp", "tp"))
    reached = reached_by_backward(choices)
    (scaled,) = [user.name for user in nodes[leaf].users]
    assert scaled in reached  # the product with 2 hands the leaf its gradient
    assert leaf not in reached  # the leaf keeps it: what it was made from gets none
    owners = traced.node_modules
    assert not any(owners.get(name, "").startswith("query") for name in reached)


def test_no_leaf_without_requires_grad():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            return self.proj(x) + torch.zeros_like(x).requires_grad_(False)

    with torch.device("meta"):
        traced = trace_model(Plain(), (torch.randn(4, 16),), loss_fn=lambda out, batch: out.sum())
    assert not traced.grad_leaves
