"""Which ops one op's backward runs on its output's gradient, and whether DTensor keeps a
partial gradient partial through them.

An elementwise op of one tensor is linear in its output's gradient, but DTensor keeps a
partial gradient partial only through the ops it rules linear: a product with a
replicated value, a division of it, a negation, a cast, a view or an expand and a sum.
``rsqrt``'s backward multiplies the gradient by the saved result, and an RMSNorm's
partial gradient goes on unreduced; ``sigmoid``'s runs ``sigmoid_backward`` and
``clamp``'s a ``where``, which DTensor runs on a whole gradient: it reduces the partial
one first (GPT-OSS's gate, ``gate.clamp(max=limit)`` and ``gate * sigmoid(gate * alpha)``).

``backward_keeps_partial`` runs the op's backward once on meta tensors of the traced
shapes and follows the gradient through the ops it runs.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_aten = torch.ops.aten

_LINEAR_IN_ONE = {  # op -> the argument positions a partial may come in by
    _aten.mul.Tensor: (0, 1), _aten.mul.Scalar: (0,), _aten.div.Tensor: (0,), _aten.div.Scalar: (0,),
    _aten.neg.default: (0,), _aten._to_copy.default: (0,), _aten.expand.default: (0,), _aten.sum.dim_IntList: (0,),
    _aten.sum.default: (0,), _aten.view.default: (0,), _aten._unsafe_view.default: (0,),
    _aten.unsqueeze.default: (0,), _aten.squeeze.dim: (0,), _aten.clone.default: (0,), _aten.alias.default: (0,),
}
"""Ops DTensor runs on a partial operand at these positions, the others replicated, as partial."""
_SUMS = (_aten.add.Tensor, _aten.sub.Tensor)
"""Partial where every tensor operand is (a partial plus a replicated value is not)."""

_known: dict[tuple, bool] = {}


def backward_keeps_partial(node: fx.Node) -> bool:
    """Whether DTensor runs the backward of the traced op ``node`` on a partial output
    gradient without reducing it: every op on the gradient's way keeps it partial. True
    where the backward cannot be run here (the rule it replaces stands)."""
    key = (node.target, *(_describe(a) for a in tree_flatten((node.args, node.kwargs))[0]))
    if key not in _known:
        try:
            _known[key] = all(_keeps_partial(*read) for read in _gradient_ops(node))
        except Exception:  # an op meta tensors cannot run: keep the rule it would refine
            _known[key] = True
    return _known[key]


def _describe(arg):
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) else repr(value)


def _keeps_partial(op, positions: tuple[int, ...], operands: int) -> bool:
    if op in _SUMS:
        return len(positions) == operands
    allowed = _LINEAR_IN_ONE.get(op)
    return allowed is not None and len(positions) == 1 and positions[0] in allowed


def _gradient_ops(node: fx.Node) -> list[tuple]:
    """``(op, positions of the gradient's descendants among its tensor arguments, how many
    tensor arguments it has)`` for each
    op of ``node``'s backward that reads the output's gradient or a value made from it."""
    inputs = []

    def meta(arg):
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if not isinstance(arg, fx.Node):
            return arg
        if not isinstance(value, torch.Tensor):
            raise TypeError("not a tensor")
        tensor = torch.empty(value.shape, dtype=value.dtype, device="meta", requires_grad=value.is_floating_point())
        if tensor.requires_grad:
            inputs.append(tensor)
        return tensor

    args, kwargs = tree_map(meta, (node.args, node.kwargs), is_leaf=lambda a: isinstance(a, fx.Node))
    out = node.target(*args, **kwargs)
    grad = torch.ones_like(out)
    recorder = _FollowGradient(grad)
    with recorder:
        torch.autograd.grad(out, inputs, grad, allow_unused=True)
    return recorder.ops


class _FollowGradient(TorchDispatchMode):
    """Records the ops that read the gradient or a tensor made from it."""

    def __init__(self, grad: torch.Tensor):
        super().__init__()
        self.made = [grad]  # held, so that no id is reused while recording
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        ids = {id(t) for t in self.made}
        positions = tuple(i for i, t in enumerate(tensors) if id(t) in ids)
        if positions:
            self.ops.append((func, positions, len(tensors)))
            self.made += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out
