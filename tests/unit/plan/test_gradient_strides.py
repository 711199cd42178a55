"""Which views copy their gradient in the backward (``plan/gradient_strides.py``): a copy is
a ``clone``, which reduces a partial gradient under DTensor, where a view carries it on."""

import torch
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.plan.gradient_rules import passes_gradient
from autoplan.plan.gradient_strides import copies_gradient
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten


class EagerAttention(nn.Module):
    """Heads split the way BERT-style eager attention splits them, batched matmuls after
    ``.contiguous()``."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def split(self, x):
        b, s, h = x.shape
        return x.view(b, s, self.heads, h // self.heads).permute(0, 2, 1, 3).contiguous().view(-1, s, h // self.heads)

    def forward(self, x):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        probs = torch.softmax(torch.bmm(q, k.transpose(-1, -2)), dim=-1)
        return torch.bmm(probs, v).sum()


def _choices():
    traced = trace_model(EagerAttention().train(), (torch.randn(2, 8, 32),))
    return build_choices(traced, (2, 4), ("dp", "tp"))


def _head_views(graph):
    """The 4-D views that split heads off each projection's output, in graph order."""
    found = []
    for decision in graph.decisions():
        node = decision.fx_node
        if node.target is aten.view.default and len(node.meta["val"].shape) == 4:
            found.append(decision.name)
    return found


def test_the_view_before_a_permute_copies_the_gradient_a_batched_matmul_hands_back():
    # The gradient bmm hands its operand is contiguous; the permute's backward puts the heads
    # dim back in the middle, and the reshape to (b, s, hidden) cannot view that memory: it
    # copies (autograd's reshape: clone, then a view), as DeBERTa-v2's attention did on a
    # fake process group. q and v are read by bmm directly; k through a transpose, whose
    # backward hands the heads' memory back transposed, which views.
    graph = _choices().graph
    q, k, v = _head_views(graph)
    assert copies_gradient(graph, q)
    assert copies_gradient(graph, v)
    assert not copies_gradient(graph, k)


def test_a_view_of_a_contiguous_gradient_does_not_copy():
    # The 2-D views of the projections' inputs and outputs get contiguous gradients.
    graph = _choices().graph
    flat = [d.name for d in graph.decisions() if d.fx_node.target is aten.view.default and len(d.fx_node.meta["val"].shape) == 2]
    assert flat
    assert not any(copies_gradient(graph, name) for name in flat)


def test_a_copy_hands_its_gradient_on_as_it_is():
    # ``.contiguous()`` traces as clone, whose backward runs no op: a partial gradient goes
    # through it unreduced, to the view whose backward copies it.
    graph = _choices().graph
    clones = [d.name for d in graph.decisions() if d.fx_node.target is aten.clone.default]
    assert len(clones) == 3
    assert all(passes_gradient(graph, name) for name in clones)
