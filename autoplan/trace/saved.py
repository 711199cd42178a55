"""Which traced values autograd saves for the backward.

The traced forward runs under autograd like a training step's, so every tensor an op
saves for its backward passes through ``saved_tensors_hooks``' pack hook; under
``make_fx`` that tensor has a proxy, whose graph node is the value kept. Only those stay
alive from the forward to the backward: the output of an ``add`` or of a linear layer
followed by a residual is freed at once, the input of a matmul is kept, and a parameter
or batch tensor an op saves is already there (its memory is counted as such). Which op
saved a value matters too: a copy of a value moved to an op's layout stays alive only
where that op saves it (a weight gathered for an embedding is freed at once, one gathered
for a matmul is kept).
"""

from __future__ import annotations

import operator
from contextlib import contextmanager

import torch

from autoplan.trace.traced_node import traced_node


@contextmanager
def record_saved():
    """Yields a set that collects, for each tensor autograd saves while tracing, the pair
    (name of its graph node, name of the last graph node made before it was saved)."""
    saved: set[tuple[str, str]] = set()

    def pack(tensor):
        node = traced_node(tensor)
        if node is not None:  # its graph is the one being traced (the proxy mode's)
            last = next(iter(reversed(node.graph.nodes)))
            saved.add((node.name, last.name))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved


def savers(graph: torch.fx.Graph, recorded) -> frozenset[tuple[str, str]]:
    """(saved node, an op that may have saved it) from ``record_saved``'s pairs.

    Autograd saves an op's inputs before the op runs (before its node exists) and its
    outputs after. A value saved by the first op made after that point that reads it is
    that op's input. A value saved right after its own op was made is either that op's
    output or the input of the op that reads it next: both are named (a saved copy is
    then counted once too often rather than missed).
    """
    nodes = list(graph.nodes)
    order = {node.name: i for i, node in enumerate(nodes)}

    def op_of(node):
        return node.args[0] if node.target is operator.getitem else node

    found = set()
    for name, last in recorded:
        if name not in order or last not in order:  # made in a graph of its own (a nested trace)
            found.add((name, ""))
            continue
        position = order[last]
        later = [user for user in nodes[order[name]].users if user.op == "call_function" and order[user.name] > position]
        reader = min(later, key=lambda user: order[user.name]).name if later else ""
        made = op_of(nodes[position])
        if op_of(nodes[order[name]]) is made:
            found.add((name, made.name))
            if not reader:
                continue
        found.add((name, reader))
    return frozenset(found)
