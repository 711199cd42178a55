"""What the backward of a traced op runs, read off a run of it on meta tensors of the
traced shapes (once per op signature).

The trace records the forward only; two later stages need to know what autograd runs
for an op's backward, which its derivative formula decides:

- the choice graph (``choices/graph.py``): an op planned replicated for want of a
  sharding rule needs the kernels of its backward replicated too, and not all are named
  after it (``im2col``'s, ``F.unfold`` in ConvBERT's span convolution, is ``col2im``);
- the prediction (``plan/backward_ops.py``): whether DTensor carries a partial gradient
  through those ops unreduced (``sigmoid``'s ``sigmoid_backward`` reduces it first);
  which op makes each input's gradient last (``gradient_makers``: ``linalg_solve_triangular``'s
  ``tril``, which DTensor runs on a whole gradient only); and
  (``plan/runtime_choice.gradient_only_backward``) the layout DTensor's rules give the
  input's gradient, the backward run under a dispatch mode that follows the layouts
  (``input_gradients``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map


@dataclass(frozen=True, slots=True)
class BackwardOp:
    """One op the backward ran."""

    op: object
    """The aten op (an ``OpOverload``)."""
    gradient_positions: tuple[int, ...]
    """Positions, among its tensor arguments, of the output's gradient or of values made from it."""
    operands: int
    """How many tensor arguments it took."""


@dataclass(frozen=True, slots=True)
class GradientMaker:
    """The op whose output is one input's gradient: the last step of the backward for it."""

    op: object
    """The aten op (an ``OpOverload``)."""
    args: tuple
    """Its arguments, meta tensors standing for tensors."""
    kwargs: dict


@dataclass(frozen=True, slots=True)
class _Run:
    ops: tuple[BackwardOp, ...]
    makers: dict[int, GradientMaker]
    """Tensor input position (as the choice graph numbers an op's inputs) -> its gradient's maker."""


_runs: dict[tuple, _Run | None] = {}


def backward_run(node: fx.Node) -> tuple[BackwardOp, ...] | None:
    """The ops the backward of ``node``'s op runs, in order, given gradients for its
    floating outputs; None where that backward cannot run on meta tensors."""
    run = _cached_run(node)
    return run.ops if run is not None else None


def gradient_makers(node: fx.Node) -> dict[int, GradientMaker]:
    """Tensor input position of ``node`` -> the op of its backward that made that input's
    gradient; empty where the backward cannot run on meta tensors."""
    run = _cached_run(node)
    return run.makers if run is not None else {}


def _cached_run(node: fx.Node) -> _Run | None:
    key = signature(node)
    if key not in _runs:
        try:
            _runs[key] = _run(node)
        except Exception:  # an op meta tensors cannot run: nothing learnt
            _runs[key] = None
    return _runs[key]


def signature(node: fx.Node) -> tuple:
    """What decides ``node``'s backward: its op and its arguments' shapes, strides, dtypes
    and values (two ops alike in these run the same backward)."""
    return (node.target, *(_describe(a) for a in tree_flatten((node.args, node.kwargs))[0]))


def _describe(arg):
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
    return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) else repr(value)


def _run(node: fx.Node) -> _Run:
    recorders: list[_Recorder] = []

    def recording(gradients):
        recorders.append(_Recorder(gradients))
        return recorders[-1]

    found = _backward(node, recording)
    if not recorders:
        return _Run((), {})
    recorder = recorders[0]
    makers = {
        position: recorder.makers[id(gradient)]
        for position, gradient in zip(_floating_positions(node), found or ())
        if gradient is not None and id(gradient) in recorder.makers
    }
    return _Run(tuple(recorder.ops), makers)


def _floating_positions(node: fx.Node) -> list[int]:
    """The positions, among ``node``'s tensor arguments, of its floating ones (those
    ``_backward`` asks gradients for, in its order)."""
    values = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in tree_flatten((node.args, node.kwargs))[0]]
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    return [position for position, tensor in enumerate(tensors) if tensor.is_floating_point()]


def input_gradients(node: fx.Node, mode_for) -> list | None:
    """The gradients the backward of ``node``'s op hands its floating tensor arguments (in
    order; None for one it hands none), run on meta tensors under the dispatch mode
    ``mode_for(output gradients)`` makes; None where the op takes no gradient or meta
    tensors cannot run its backward."""
    try:
        return _backward(node, mode_for)
    except Exception:  # an op meta tensors cannot run, or the mode gave up: nothing learnt
        return None


def _backward(node: fx.Node, mode_for) -> list | None:
    leaves: list[torch.Tensor] = []

    def stand_in(arg):
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
        if not isinstance(value, torch.Tensor):
            return value
        tensor = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if tensor.is_floating_point():
            leaves.append(tensor.requires_grad_())
        return tensor

    args, kwargs = tree_map(stand_in, (node.args, node.kwargs), is_leaf=lambda a: isinstance(a, fx.Node))
    assert callable(node.target), node  # an op node
    outputs = [x for x in tree_flatten(node.target(*args, **kwargs))[0] if isinstance(x, torch.Tensor) and x.requires_grad]
    if not outputs:
        return None
    gradients = [torch.ones_like(x) for x in outputs]
    with mode_for(gradients):
        return list(torch.autograd.grad(outputs, leaves, gradients, allow_unused=True))


class _Recorder(TorchDispatchMode):
    """Records every op, and which of its arguments the gradients are or were made from."""

    def __init__(self, gradients: list[torch.Tensor]):
        super().__init__()
        self.made = list(gradients)  # held, so that no id is reused while recording
        self.ops: list[BackwardOp] = []
        self.makers: dict[int, GradientMaker] = {}  # id of an op's output -> the op and its arguments
        self.held: list = []  # every output, so that no id in ``makers`` is reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        ids = {id(t) for t in self.made}
        positions = tuple(i for i, t in enumerate(tensors) if id(t) in ids)
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if positions:
            self.made += results
        self.ops.append(BackwardOp(func, positions, len(tensors)))
        self.held += results
        self.makers.update((id(t), GradientMaker(func, args, kwargs or {})) for t in results)
        return out
