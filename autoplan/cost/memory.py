"""Per-device memory of one training step: what is alive at its two peaks.

A step's memory peaks either where its backward starts or where it ends (measured with
torch's ``MemTracker`` on the applied plans, ``benchmarks/memory.py``):

- backward start (``NodeCost.memory_bytes``, the ILP's budget row): parameters and
  AdamW's two moments (from the second step on), buffers, the batch, every value autograd
  saved for the backward (``trace/saved.py``; a value saved through views counted once, in
  the layout it was made in), the moved copies of saved values the apply engine keeps
  (``EdgeCost.kept_bytes``: a parameter gathered for its use, a saved value DTensor
  redistributed; ``dtensor/saved_inputs.py``), and the first backward op's own gradients
  (``TRANSIENT``: the gradient of its output and of its inputs, alive together; for a
  language model the cross-entropy's, several float32 logits in size). Gradients of
  parameters do not exist yet: ``zero_grad`` sets them to None.
- backward end / ``AdamW.step()`` (``NodeCost.end_bytes``): parameters, their gradients and
  the moments, buffers and the batch; every activation is freed by then.

Between the two, activations are freed as gradients appear; a layer's saved values
outweigh its parameters' gradients in every model benchmarked, so neither peak is passed.
"""

from __future__ import annotations

from autoplan.choices.graph import OP
from autoplan.placements import Spec

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
    """The op whose backward holds the most gradient at once (its output's and its inputs'),
    counted whole: for a language model the cross-entropy's log-softmax, whose backward
    runs first, while every saved value is still alive."""
    from autoplan.cost.estimate import output_values, tensor_bytes

    graph = choices.graph
    best, most = None, 0.0
    for decision in graph.decisions():
        if decision.kind != OP or not decision.requires_grad or _is_view(decision):
            continue
        held = sum(tensor_bytes(v) for v in output_values(decision))
        for u, index, _ in graph.inputs_of(decision.name):
            if graph.decision(u).requires_grad:
                values = output_values(graph.decision(u))
                held += tensor_bytes(values[index]) if index < len(values) else 0.0
        if held > most:
            best, most = decision.name, held
    return best


def kept_copy(src: Spec, dst: Spec) -> bool:
    """Whether moving a saved value from ``src`` to ``dst`` leaves a copy the step keeps
    until the backward: any move that communicates (a slice of a replicated value is a view)."""
    from autoplan.cost.comm import moves_locally

    return src != dst and not moves_locally(src, dst)


def _is_view(decision) -> bool:
    from autoplan.cost.estimate import is_view

    return is_view(decision)
