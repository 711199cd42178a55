"""Whether DTensor keeps a partial gradient partial through the ops one op's backward runs.

An elementwise op of one tensor is linear in its output's gradient, but DTensor keeps a
partial gradient partial only through the ops it rules linear: a product with a
replicated value, a division of it, a negation, a cast, a view or an expand and a sum.
``rsqrt``'s backward multiplies the gradient by the saved result, and an RMSNorm's
partial gradient goes on unreduced; ``sigmoid``'s runs ``sigmoid_backward`` and
``clamp``'s a ``where``, which DTensor runs on a whole gradient: it reduces the partial
one first (GPT-OSS's gate, ``gate.clamp(max=limit)`` and ``gate * sigmoid(gate * alpha)``).

``backward_keeps_partial`` follows the gradient through the ops the op's backward runs
(``trace/backward_run.py``).
"""

from __future__ import annotations

import torch
from torch import fx

from autoplan.trace.backward_run import BackwardOp, backward_run

_aten = torch.ops.aten

_LINEAR_IN_ONE: dict[object, tuple[int, ...]] = {  # op -> the argument positions a partial may come in by
    _aten.mul.Tensor: (0, 1), _aten.mul.Scalar: (0,), _aten.div.Tensor: (0,), _aten.div.Scalar: (0,),
    _aten.neg.default: (0,), _aten._to_copy.default: (0,), _aten.expand.default: (0,), _aten.sum.dim_IntList: (0,),
    _aten.sum.default: (0,), _aten.view.default: (0,), _aten._unsafe_view.default: (0,),
    _aten.unsqueeze.default: (0,), _aten.squeeze.dim: (0,), _aten.clone.default: (0,), _aten.alias.default: (0,),
}
"""Ops DTensor runs on a partial operand at these positions, the others replicated, as partial."""
_SUMS = (_aten.add.Tensor, _aten.sub.Tensor)
"""Partial where every tensor operand is (a partial plus a replicated value is not)."""


def backward_keeps_partial(node: fx.Node) -> bool:
    """Whether DTensor runs the backward of the traced op ``node`` on a partial output
    gradient without reducing it: every op on the gradient's way keeps it partial. True
    where the backward cannot be run here (the rule it replaces stands)."""
    run = backward_run(node)
    if run is None:
        return True
    return all(_keeps_partial(read) for read in run if read.gradient_positions)


def _keeps_partial(read: BackwardOp) -> bool:
    if read.op in _SUMS:
        return len(read.gradient_positions) == read.operands
    allowed = _LINEAR_IN_ONE.get(read.op)
    return allowed is not None and len(read.gradient_positions) == 1 and read.gradient_positions[0] in allowed


def backward_reads_only_gradient(node: fx.Node) -> bool:
    """Whether the backward of the traced op ``node`` runs on its output's gradient alone,
    reading nothing saved (``1 - w``'s negation): whatever layout the op made its output
    in, nothing there asks for the gradient whole."""
    run = backward_run(node)
    return run is not None and all(read.operands == len(read.gradient_positions) for read in run)
