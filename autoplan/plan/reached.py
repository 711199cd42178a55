"""Which values of the traced step get a gradient in its backward."""

from __future__ import annotations

import networkx as nx

from autoplan.choices.graph import OP
from autoplan.cost.estimate import gradient_roots
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
    leading = nx.ancestors(graph, loss[0]) | {loss[0]}
    roots = gradient_roots(choices)
    writes = [
        (decision.name, roots.get(written.name, written.name))
        for decision in graph.decisions()
        if decision.kind == OP and (written := _written_in_place(decision.fx_node)) is not None
    ]
    grown = True
    while grown:  # a write can make another write's target lead to the loss
        grown = False
        for name, root in writes:
            if name not in leading and root in leading:
                leading |= nx.ancestors(graph, name) | {name}
                grown = True
    return {name for name in leading if graph.decision(name).requires_grad}


def _written_in_place(node):
    """The tensor argument ``node``'s op writes into (its first, for ``copy_``, ``add_``
    and the like), or None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments or not node.args:
        return None
    alias = schema.arguments[0].alias_info
    first = node.args[0]
    return first if alias is not None and alias.is_write and hasattr(first, "name") else None
