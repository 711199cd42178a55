"""Per-device memory of one training step: what is alive at its three peaks.

A step's memory peaks where its backward starts, where it ends, or inside the forward
where a large value is gathered late (measured with torch's ``MemTracker`` on the applied
plans, ``benchmarks/memory.py``):

- backward start (``NodeCost.memory_bytes``, the ILP's budget row): parameters and
  AdamW's two moments (from the second step on), buffers, the batch, every value autograd
  saved for the backward (``trace/saved.py``; a value saved through views counted once, in
  the layout it was made in), the moved copies of saved values the apply engine keeps
  (``EdgeCost.kept_bytes``, ``kept_reads``: a parameter gathered for a matmul, a saved
  value DTensor redistributed; ``dtensor/saved_inputs.py``), the model's output where it
  is only summed (``transient_parts``), and the first backward op's own gradients
  (``TRANSIENT``: the gradient of its output and of its inputs, alive together; for a
  language model the cross-entropy's, several float32 logits in size; none for an output
  that is only summed, ``broadcast_gradient``; and the weights it reads split, gathered
  again for its backward, ``estimate.regathered_weights``). Gradients of
  parameters do not exist yet: ``zero_grad`` sets them to None.
- backward end / ``AdamW.step()`` (``NodeCost.end_bytes``): parameters, their gradients and
  the moments, buffers and the batch; every activation is freed by then.
- the forward's heaviest move (``NodeCost.forward_bytes``, ``EdgeCost.forward_bytes``,
  ``heaviest_move``): what the forward saved up to the op whose reads move the most, and
  that move's buffers (``moving_bytes``). A language model's output head reads its
  weight gathered, after every layer saved its activations: a split of the hidden dim is
  gathered into a buffer and copied into place, two weights' worth at once.

Between these, activations are freed as gradients appear; a layer's saved values
outweigh its parameters' gradients in every model benchmarked, so no other peak is passed.
"""

from __future__ import annotations

import torch

from autoplan.choices.graph import OP, PARAMETER
from autoplan.cost.values import is_view, output_values, tensor_bytes
from autoplan.placements import Spec, shard_dim, shard_factor

_WHOLE_SUM = torch.ops.aten.sum.default

STATE_COPIES_START = 3
"""Parameter, exp_avg, exp_avg_sq: a trainable parameter at the backward's start."""
STATE_COPIES_END = 4
"""The same and its gradient, at the backward's end and in ``AdamW.step()``."""


def saved_values(choices) -> set[tuple[str, int]]:
    """(decision, output index) of every value autograd saves, and of every value a saved
    view is a view of (the view chain up to the value that owns the memory)."""
    graph = choices.graph
    traced = choices.traced
    nodes = {node.name: node for node in traced.graph_module.graph.nodes}
    found: set[tuple[str, int]] = set()
    for name in traced.saved:
        node = nodes.get(name)
        index = 0
        if node is not None and name not in graph and node.op == "call_function" and isinstance(node.args[0], type(node)):
            name, index = node.args[0].name, node.args[1]  # getitem of a multi-output op
        while name in graph:
            found.add((name, index))
            decision = graph.decision(name)
            inputs = graph.inputs_of(name)
            if decision.kind != OP or not _is_view(decision) or len(inputs) != 1:
                break
            name, index, _ = inputs[0]
    return found


def kept_reads(choices) -> set[tuple[str, str, int]]:
    """(producer, consumer, input index) of every read whose value the consumer keeps for
    the backward: it saves that input, or it is a view of it that some reader keeps. A
    copy moved to the consumer's layout lives as long as that (``EdgeCost.kept_bytes``).
    A value whose saver could not be told counts as kept by every reader."""
    graph = choices.graph
    traced = choices.traced
    savers: dict[tuple[str, int], set[str]] = {}
    for name, saver in traced.saved_by:
        savers.setdefault(traced.value_of(name), set()).add(saver)
    views: dict[str, bool] = {}

    def kept(u: str, index: int, v: str) -> bool:
        by = savers.get((u, index), ())
        if v in by or "" in by:
            return True
        if v not in views:
            views[v] = False  # no cycles in a traced graph; set before recursing all the same
            decision = graph.decision(v)
            views[v] = decision.kind == OP and _is_view(decision) and any(kept(v, i, w) for _, w, _, i in graph.reads(v))
        return views[v]

    return {(u, v, k) for u, v, k, index in graph.reads() if kept(u, index, v)}


def saved_outputs(choices) -> dict[str, set[int]]:
    """Decision -> the output indices of it that autograd keeps (directly or through views)
    and that own their memory (not views): what the backward-start peak holds."""
    owners: dict[str, set[int]] = {}
    graph = choices.graph
    for name, index in saved_values(choices):
        decision = graph.decision(name)
        if decision.kind == OP and not _is_view(decision):
            owners.setdefault(name, set()).add(index)
    return owners


def transient_node(choices) -> str | None:
    """The op around whose backward the most is held at once beside the saved values
    (``transient_parts``), counted whole: for a language model the cross-entropy's
    log-softmax, whose backward runs first, while every saved value is still alive."""
    best, most = None, 0.0
    for decision in choices.graph.decisions():
        if decision.kind != OP or not decision.requires_grad or _is_view(decision):
            continue
        held = max(sum(tensor_bytes(value) for value, _, _ in part) for part in transient_parts(choices, decision))
        if held > most:
            best, most = decision.name, held
    return best


def transient_parts(choices, decision) -> tuple[list, list]:
    """Two sets of values, each alive at once beside the saved values, as
    ``(value, "out" or "in", index)``:

    - the gradients the op's backward holds: its outputs' (none where the output is only
      summed, ``broadcast_gradient``) and those of its inputs that need one;
    - for the op that makes the loss, its inputs that autograd does not keep (logits that
      are only summed), still alive where the forward ends: the model's output holds them
      until the loss is taken.
    """
    graph = choices.graph
    name = decision.name
    gradients = [(v, "out", i) for i, v in enumerate(output_values(decision)) if not broadcast_gradient(graph, name, i)]
    alive = []
    loss = choices.traced.loss_value
    saved = saved_values(choices) if loss is not None and name == loss[0] else None
    for u, index, k in graph.inputs_of(name):
        values = output_values(graph.decision(u))
        if index >= len(values):
            continue
        if graph.decision(u).requires_grad and decision.fx_node.target != _WHOLE_SUM:
            gradients.append((values[index], "in", k))
        if saved is not None and (u, index) not in saved:
            alive.append((values[index], "in", k))
    return gradients, alive


def broadcast_gradient(graph, name: str, index: int) -> bool:
    """Whether the gradient of output ``index`` of ``name`` owns no memory: every reader,
    through views, sums the whole value (the loss autoplan takes as the output's sum,
    ``trace/loss.py``), whose backward expands one scalar, a view."""
    readers = [(v, graph.decision(v)) for _, v, _, i in graph.reads(name) if i == index]
    if not readers:
        return False
    for reader, decision in readers:
        if decision.kind != OP:
            return False
        if decision.fx_node.target == _WHOLE_SUM:
            continue
        if not _is_view(decision) or not broadcast_gradient(graph, reader, 0):
            return False
    return True


def moving_bytes(src: Spec, dst: Spec, value, mesh_shape) -> float:
    """The buffers a move of ``value`` (a traced tensor) from ``src`` to ``dst`` holds while
    its reader runs: the moved copy, and where it gathers a split of any dim but the
    outermost in memory, the gathered buffer too (collectives gather along the outermost
    dim; DTensor then copies the pieces into place). A weight read transposed (a linear's
    ``t``) is gathered as it is stored, so its strides, not its dims' order, decide."""
    if not kept_copy(src, dst):
        return 0.0
    copy = tensor_bytes(value) / shard_factor(dst, mesh_shape)
    sizes, strides = tuple(value.shape), value.stride()
    outermost = max((d for d in range(len(sizes)) if sizes[d] > 1), key=lambda d: strides[d], default=0)
    rearranged = any(shard_dim(a) not in (None, outermost) and a != b for a, b in zip(src, dst))
    return 2 * copy if rearranged else copy


def weight_values(graph) -> set[str]:
    """Parameters and the views of them (a linear's ``t``): what a module gathers for its use."""
    return {decision.name for decision in graph.decisions() if is_weight(graph, decision.name)}


def is_weight(graph, name: str) -> bool:
    """Whether ``name`` is a parameter or a view of one (``weight_values``)."""
    while graph.decision(name).kind != PARAMETER:
        inputs = graph.inputs_of(name)
        if not _is_view(graph.decision(name)) or len(inputs) != 1:
            return False
        name = inputs[0][0]
    return True


def heaviest_move(graph, nodes, moving) -> str | None:
    """The op whose reads of weights move the most (``moving``: edge -> ``moving_bytes``
    grid, at its largest; the edges out of ``weight_values``) on top of what the forward
    has saved before it, judged at each decision's leanest: where the forward's own peak
    is (the output head's weight, gathered where the logits are made, after every layer
    saved its activations). Only weights count: every layout of an activation is the
    solver's to avoid, a sharded weight's gather is what its storage costs. None where
    no weight moves."""
    into: dict[str, float] = {}
    for (_, v, _), grid in moving.items():
        into[v] = into.get(v, 0.0) + max(max(row) for row in grid)
    best, most, before = None, 0.0, 0.0
    for name in graph.nodes:  # graph order
        if into.get(name, 0.0) > 0 and graph.decision(name).kind == OP and before + into[name] >= most:
            best, most = name, before + into[name]
        memory = nodes[name].memory_bytes
        before += min(memory) if memory else 0.0
    return best


def kept_copy(src: Spec, dst: Spec) -> bool:
    """Whether moving a saved value from ``src`` to ``dst`` leaves a copy the step keeps
    until the backward: any move that communicates (a slice of a replicated value is a view)."""
    from autoplan.cost.comm import moves_locally

    return src != dst and not moves_locally(src, dst)


def _is_view(decision) -> bool:
    return is_view(decision)
