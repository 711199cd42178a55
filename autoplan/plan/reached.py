"""Which values of the traced step get a gradient in its backward."""

from __future__ import annotations

import networkx as nx
import torch

from autoplan.choices.graph import OP, written_in_place
from autoplan.cost.estimate import gradient_roots, output_values
from autoplan.plan.loss_reductions import loss_output


def reached_by_backward(choices) -> set[str]:
    """The decisions whose outputs get a gradient: those that need one and lead to the loss
    (a pooler whose output the loss never reads, BigBird's under its causal-LM head, gets
    none, and its module hooks move nothing back), or write in place into a value that
    does (``out[:, t] = x``: RWKV's recurrence writes each step's output so, and autograd's
    backward of the write hands ``x`` its part of the gradient of ``out``)."""
    graph = choices.graph
    loss = loss_output(choices)
    if loss is None:
        return {name for name in graph.nodes if graph.decision(name).requires_grad}
    leaves = choices.traced.grad_leaves
    backward = _backward_edges(graph, leaves)
    leading = _reached_from(backward, loss[0])
    roots = gradient_roots(choices)
    writes = [
        (decision.name, roots.get(written.name, written.name))
        for decision in graph.decisions()
        if decision.kind == OP and (written := written_in_place(decision.fx_node)) is not None
    ]
    grown = True
    while grown:  # a write can make another write's target lead to the loss
        grown = False
        for name, root in writes:
            if name not in leading and root in leading:
                leading |= _reached_from(backward, name)
                grown = True
    # a leaf the forward made (``trace/grad_leaves.py``) keeps its gradient: its own op and
    # what it read get none from it
    return {name for name in leading if graph.decision(name).requires_grad and name not in leaves}


def _backward_edges(graph, leaves=frozenset()) -> nx.DiGraph:
    """Reader -> value edges along which a gradient goes back: a read of a floating-point
    value by an op that takes a gradient. None goes back through an integer one: DeepSeek
    V3.2's indexer scores keys and hands the attention only its top-k indices, so its
    projections get no gradient (and run under ``torch.no_grad``). Nor through what a leaf
    the forward made read (``leaves``: ``zeros_like(query).requires_grad_()``)."""
    edges = nx.DiGraph()
    edges.add_nodes_from(graph.nodes)
    for u, v, _, out_index in graph.reads():
        if graph.decision(v).requires_grad and v not in leaves and _floating(output_values(graph.decision(u))[out_index]):
            edges.add_edge(v, u)
    return edges


def _reached_from(backward: nx.DiGraph, name: str) -> set[str]:
    return nx.descendants(backward, name) | {name}


def _floating(value) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())

