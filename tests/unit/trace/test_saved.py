"""Which op saved each value autograd keeps (``trace/saved.py``), and so which moved copies
the step keeps until the backward (``cost/memory.py``'s ``kept_reads``): a weight gathered
for a matmul is kept, the same weight gathered for an embedding is freed at once."""

import torch
from torch import nn

from autoplan.choices.graph import OP, build_choices
from autoplan.cost.memory import kept_reads
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten


class TiedHead(nn.Module):
    """An embedding whose weight the output head reuses, a norm, and a residual add."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        h = self.norm(x) + x
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


def _traced():
    with torch.device("meta"):
        model, ids = TiedHead(), torch.randint(0, 32, (2, 4))
    return trace_model(model, (ids,))


def _node(traced, target):
    return next(n for n in traced.graph_module.graph.nodes if n.target == target)


def test_each_saved_value_is_told_with_the_op_that_saved_it():
    traced = _traced()
    embedding, norm, mm = (_node(traced, t) for t in (aten.embedding.default, aten.native_layer_norm.default, aten.mm.default))
    weight, ids = embedding.args[0].name, embedding.args[1].name
    savers = {}
    for name, saver in traced.saved_by:
        savers.setdefault(name, set()).add(saver)
    assert embedding.name in savers[ids]  # the embedding's backward reads the ids ...
    assert embedding.name not in savers.get(weight, set())  # ... not its weight
    assert norm.name in savers[norm.args[0].name]  # a norm keeps its input
    assert {mm.name} <= savers[mm.args[0].name] & savers[mm.args[1].name]  # a matmul both operands
    assert {name for name, _ in traced.saved_by} == traced.saved


def test_only_a_reader_that_keeps_its_input_keeps_a_moved_copy():
    choices = build_choices(_traced(), (2,), ("dp",))
    kept = kept_reads(choices)
    graph = choices.graph
    traced = choices.traced
    embedding, mm = _node(traced, aten.embedding.default), _node(traced, aten.mm.default)
    weight = embedding.args[0].name
    transposed = mm.args[1].name  # the head reads the tied weight through ``t``
    assert not any(u == weight and v == embedding.name for u, v, _ in kept)
    assert any(u == weight and v == transposed for u, v, _ in kept)  # a view a keeping reader reads
    assert any(u == transposed and v == mm.name for u, v, _ in kept)
    assert all(graph.decision(v).kind == OP for _, v, _ in kept)
