"""Where an op's backward runs on its output's gradient split as the gradient comes.

DTensor runs each backward op on the layouts its inputs arrive in; where a gradient comes
back split on an axis where the op made its output whole, some ops take it as it is and
hand their inputs split (or partial) gradients, moving nothing:

- a pointwise op and a dtype cast: DTensor slices the saved operands it multiplies by
  (``split_through``, ``split_input_gradient``); a concatenation slices the gradient along
  the joined dim, and a stack selects along the new dim (Helium's interleaved rotary
  embedding, ``stack((-x2, x1), -1)``, with the query's gradient split by heads); a
  repeat sums over its repeats, partial where the split falls on them (``repeated_split``);
- an elementwise product made split on another dim runs on the gradient's split, moving
  its saved operands there instead (``resplit_through``, ``resplit_moves``);
- a matrix product whose operands were saved whole: ``grad @ b.T`` split by the
  gradient's rows, ``a.T @ grad`` partial over them (``matmul_split_axes``,
  ``matmul_input_gradient``).

Two ops cannot: a reshape's backward reshapes the gradient back, and a split no reshape
strategy keeps is gathered first (``reshaped_gradient``); a slice's backward gathers a
gradient split on the sliced dim, or moves that split to another dim, as DTensor's rule for
``slice_backward`` asks (``sliced_gradient``).

``plan/collectives.py`` asks these where it follows a gradient back through an op; the
other rules it follows are in ``plan/gradient_rules.py``.
"""

from __future__ import annotations

import functools
import itertools

import torch

from autoplan.choices.graph import OP, planning_mesh
from autoplan.cost.comm import _moves, splits_a_dim_twice
from autoplan.cost.estimate import output_values, tensor_bytes
from autoplan.dtensor import overrides
from autoplan.placements import PARTIAL, REPLICATE, is_partial, is_shard, shard, shard_dim
from autoplan.plan.backward_ops import backward_reads_only_gradient
from autoplan.plan.gradient_rules import is_elementwise, operand_layouts
from autoplan.plan.gradient_strides import RESHAPES
from autoplan.plan.runtime_choice import dtensor_runs, dtensor_spec, gradient_only_backward

_aten = torch.ops.aten


def split_through(graph, name: str, exits, grad: tuple, made: tuple, mesh_shape, operands: dict) -> tuple[bool, ...]:
    """Per axis: whether ``name``'s output gradient, split there while the output was made
    whole, stays split into its backward. A pointwise op's backward is pointwise too:
    DTensor runs it on the split gradient, slicing the saved inputs it multiplies by
    (no gather), so the gradient reaches the inputs split (``split_input_gradient``);
    one whose backward reads the gradient alone keeps any split, on whatever dim the
    output was made split. So does a reduction's over some dims, which broadcasts the
    gradient back over them (a ``logsumexp``'s; a sum's or mean's: Zaya's key residual, a
    mean over query heads, with its gradient split by batch on tp), a concatenation's,
    which slices the gradient along the joined dim, a stack's, which selects along its
    new dim, a repeat's where DTensor's view keeps the split (``repeated_split``), an
    elementwise product's where the output was made split on another dim
    (``resplit_through``; ``operands``: input index -> (layout autograd saved, layout
    read)), or any of these made split on another dim where the backward reads nothing
    saved; and the backward of an op of one tensor that reads its gradient alone where
    DTensor's rules keep the split (``gradient_only_split``: a pad's, a cumulative
    sum's). A pointwise op made partial ran linear there (a cast, a product with one
    partial operand), and so does its backward, on the split gradient as it comes (Beam's
    experts cast ``act(gate) * up``, partial on tp, before their down projection, whose
    backward hands it a gradient split by columns there). A module output's hook puts
    the gradient back in the layout DTensor made first."""
    if name in exits:
        return (False,) * len(grad)
    node = graph.decision(name).fx_node
    if _is_repeat(graph, name):
        return tuple(
            (d := shard_dim(g)) is not None and _made_whole(q) and not splits_a_dim_twice(grad)
            and repeated_split(node, d, ways) is not None
            for g, q, ways in zip(grad, made, mesh_shape)
        )
    pointwise = is_elementwise(graph, name)
    if pointwise and backward_reads_only_gradient(node):
        # nothing saved to line the gradient up with (a product with a number, a cast): it
        # runs on the gradient split as it comes, on whatever dim the op made its output
        # split (MiniCPM3's scaled residual branch, made split by batch on dp, hands on its
        # gradient split by hidden there)
        return tuple(is_shard(g) for g in grad)
    if _reduced_dims(graph, name) is not None:
        # the gradient, broadcast back over the reduced dims (for a logsumexp, times saved
        # values DTensor slices to its split): GraniteMoE-SWA's attention sinks take the
        # scores' logsumexp, Zaya's key residual is a mean over query heads
        return tuple(is_shard(g) and _made_whole(q) for g, q in zip(grad, made))
    joined = None if pointwise else _joined_dim(graph, name)  # split on any other dim, a slice stays split
    if not (pointwise or joined is not None):
        return tuple(
            _made_whole(q) and gradient_only_split(graph, name, grad, axis, mesh_shape) is not None
            for axis, q in enumerate(made)
        )
    resplit = resplit_through(graph, name, exits, grad, made, operands)
    # a backward that reads nothing saved runs on the gradient as it comes, split on another
    # dim than the op made (ESMC's rotary ``cat((-x2, x1), -1)``, made split by sequence,
    # slices a gradient split by heads)
    anywhere = backward_reads_only_gradient(node)
    return tuple(
        r or (
            is_shard(g) and shard_dim(g) != joined
            and (_made_whole(q) or (pointwise and is_partial(q)) or (anywhere and _split_elsewhere(g, q)))
        )
        for r, g, q in zip(resplit, grad, made)
    )


def _split_elsewhere(grad: str, made: str) -> bool:
    """Whether a gradient and the output it belongs to are split on different dims."""
    return is_shard(grad) and is_shard(made) and shard_dim(made) != shard_dim(grad)


def gradient_only_split(graph, name: str, grad: tuple, axis: int, mesh_shape) -> str | None:
    """The placement on ``axis`` of the gradient that ``name``, an op of one tensor whose
    backward reads nothing but its output's gradient, hands its input where that gradient
    comes split there (``grad[axis]``): DTensor runs each op of the backward on it as it
    comes (``runtime_choice.gradient_only_backward``). A Mamba-2 scan pads its chunks
    and sums its decays cumulatively along the sequence; their gradients, split by heads,
    go back split, through ``constant_pad_nd`` and ``flip``, ``cumsum``, ``flip``. None
    where the backward moves it (or reads a saved value): the gradient is gathered first."""
    decision = graph.decision(name)
    if decision.kind != OP or len(graph.inputs_of(name)) != 1 or not is_shard(grad[axis]):
        return None
    alone = tuple(g if other == axis else REPLICATE for other, g in enumerate(grad))  # this axis's split only
    answer = gradient_only_backward(decision.fx_node, alone, _query_mesh(tuple(mesh_shape)))
    return answer[axis] if answer is not None and is_shard(answer[axis]) else None


@functools.cache
def _query_mesh(mesh_shape: tuple[int, ...]):
    return planning_mesh(mesh_shape, tuple(f"axis{axis}" for axis in range(len(mesh_shape))))


def _made_whole(placement: str) -> bool:
    return not is_shard(placement) and not is_partial(placement)


def _is_repeat(graph, name: str) -> bool:
    decision = graph.decision(name)
    return decision.kind == OP and decision.fx_node.target is _aten.repeat.default


def repeated_split(node, out_dim: int, ways: int) -> str | None:
    """The gradient the repeat ``node``'s backward hands its input where its output's
    gradient comes split ``ways`` ways on ``out_dim``, run on it as it comes; None where
    DTensor gathers it first. The backward (``repeat_backward``) views each repeated dim
    of ``r * n`` as ``(r, n)`` and sums over the ``r``s and over the dims the repeat added:
    on a dim not repeated the split stays, on the input's own dim; on a repeated one
    DTensor's view keeps it on the ``r`` dim where ``ways`` divides ``r``, and the sum over
    it is partial (DiffLlama's value heads, ``v.repeat(1, 2, 1, 1)``, with the gradient
    split by heads on dp); a dim the repeat added is summed, partial too."""
    repeats = list(node.args[1])
    added = len(repeats) - node.args[0].meta["val"].dim()
    if out_dim < added:
        return PARTIAL
    if repeats[out_dim] == 1:
        return shard(out_dim - added)
    return PARTIAL if repeats[out_dim] % ways == 0 else None


def resplit_through(graph, name: str, exits, grad: tuple, made: tuple, operands: dict) -> tuple[bool, ...]:
    """Per axis: whether the elementwise product ``name`` (``x * mask``: a dropout), made
    split on one dim, runs its backward on a gradient split on another dim as it comes.
    Both layouts cost DTensor the same move for ``grad * mask``, and it keeps the first
    operand's: the saved mask moves to the gradient's split (``resplit_moves``), and the
    input's gradient goes on split as the output's came (BART's dropout on a 2x4 fake
    process group: the move back ran at the module hook further on). An operand broadcast
    against the output has no such dim to move to; one autograd saved whole there moves
    nothing, as DTensor slices it for the gradient's split as for any other (ESMC's rotary
    embedding, ``q * cos`` made split by sequence, with the query's gradient split by heads
    from the attention: DTensor's forward slicing of ``cos`` ran below autograd).
    ``operands``: input index -> (layout autograd saved, layout read)."""
    decision = graph.decision(name)
    if name in exits or decision.kind != OP or decision.fx_node.target is not _aten.mul.Tensor:
        return (False,) * len(grad)
    shape = tuple(decision.fx_node.meta["val"].shape)
    inputs = graph.inputs_of(name)
    if len(inputs) != 2:
        return (False,) * len(grad)
    broadcast = [
        operands.get(k, (None, None))[0] for u, i, k in inputs
        if tuple(getattr(output_values(graph.decision(u))[i], "shape", ())) != shape
    ]
    return tuple(
        _split_elsewhere(g, q) and all(saved is not None and saved[axis] == REPLICATE for saved in broadcast)
        for axis, (g, q) in enumerate(zip(grad, made))
    )


def resplit_moves(graph, name: str, operands: dict, grad: tuple, resplit: tuple, mesh_shape) -> list:
    """``(kind, axis, bytes)`` of the saved operands ``name``'s backward moves to its
    gradient's layout on the ``resplit`` axes: for each trained input, the product of the
    gradient and the other operand as autograd saved it (``operands``: input index ->
    (saved, read))."""
    if not any(resplit):
        return []
    inputs = graph.inputs_of(name)
    found = []
    for u, _, k in inputs:
        if not graph.decision(u).requires_grad:
            continue
        for other, index, j in inputs:
            saved = operands.get(j, (None, None))[0] if j != k else None
            if saved is None:
                continue
            target = tuple(g if r else p for r, g, p in zip(resplit, grad, saved))
            nbytes = tensor_bytes(output_values(graph.decision(other))[index])
            found += _moves(saved, target, nbytes, mesh_shape)
    return found


_MATMULS = {_aten.mm.default: 0, _aten.bmm.default: 0, _aten.baddbmm.default: 1}
"""Matrix products -> the input index of their first matrix operand (``baddbmm`` adds its
first input: Bloom's ALiBi bias)."""


def matmul_split_axes(graph, name: str, exits, grad: tuple, made: tuple, operands: dict) -> tuple[bool, ...]:
    """Per axis: whether the matrix product ``name``, made whole there, runs its backward
    on its output's gradient split there as it comes. With both operands saved whole on
    that axis, DTensor's products of the split gradient and the saved operands need no
    move: ``grad @ b.T`` is split as the gradient's rows are, ``a.T @ grad`` is a partial
    sum over them (XGLM's attention scores, made whole on dp where the softmax's gradient
    came back split by query rows). So does a convolution on its gradient split by batch
    (DTensor's backward rule splits the batch only): its input's gradient split so, its
    filter's and bias's partial (Bailing's short convolution, input and filter read
    whole). ``operands``: as ``partial_axes`` takes them."""
    decision = graph.decision(name)
    convolution = decision.kind == OP and decision.fx_node.target is _aten.convolution.default
    first = 0 if convolution else _MATMULS.get(decision.fx_node.target) if decision.kind == OP else None
    if name in exits or first is None:
        return (False,) * len(grad)
    layouts = operand_layouts({k: pair for k, pair in operands.items() if k in (first, first + 1)})
    return tuple(
        is_shard(g) and (not convolution or shard_dim(g) == 0) and m == REPLICATE
        and all(layout[axis] == REPLICATE for layout in layouts)
        for axis, (g, m) in enumerate(zip(grad, made))
    )


def matmul_input_gradient(graph, name: str, k: int, after: tuple, made: tuple, exits, operands: dict, grad: tuple) -> tuple:
    """The gradient the matrix product ``name`` hands its matrix operand ``k`` on the axes
    where it runs its backward on a split gradient (``matmul_split_axes``): split on the
    batch dim where the gradient is, split on the rows of the first operand (the columns
    of the second) where the gradient's rows (columns) are, and partial on the other
    operand, whose gradient sums over the split dim."""
    split = matmul_split_axes(graph, name, exits, after, made, operands)
    if any(split) and graph.decision(name).fx_node.target is _aten.convolution.default:
        return tuple((shard(0) if k == 0 else PARTIAL) if through else g for through, g in zip(split, grad))
    first = _MATMULS.get(graph.decision(name).fx_node.target)
    if not any(split):
        return grad
    assert first is not None  # only a matrix product splits through (matmul_split_axes)
    if k not in (first, first + 1):
        return grad
    rows = graph.decision(name).fx_node.meta["val"].dim() - 2
    own = rows if k == first else rows + 1  # the output dim this operand's gradient keeps
    result = list(grad)
    for axis, through in enumerate(split):
        if through:
            dim = shard_dim(after[axis])
            assert dim is not None  # split through: a shard
            result[axis] = shard(dim) if dim < rows or dim == own else PARTIAL
    return tuple(result)


_JOINS = {_aten.cat.default: False, _aten.stack.default: True}
"""Ops that join their inputs along a dim -> whether that dim is a new one (a stack's)."""


def _joined_dim(graph, name: str) -> int | None:
    """The output dim a ``cat`` or ``stack`` joins its inputs along (non-negative), or None
    for any other op."""
    decision = graph.decision(name)
    node = decision.fx_node
    if decision.kind != OP or node.target not in _JOINS:
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return dim % node.meta["val"].dim()


_REDUCTIONS = (_aten.logsumexp.default, _aten.sum.dim_IntList, _aten.mean.dim)
"""Reductions over some dims: their backward broadcasts the gradient back over them."""


def _reduced_dims(graph, name: str) -> tuple[set[int], bool] | None:
    """(the dims, whether kept) a reduction over some dims reduces (``_REDUCTIONS``), or
    None for any other op, or one over every dim."""
    decision = graph.decision(name)
    node = decision.fx_node
    if decision.kind != OP or node.target not in _REDUCTIONS or len(node.args) < 2 or not node.args[1]:
        return None
    ndim = node.args[0].meta["val"].dim()
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return {d % ndim for d in node.args[1]}, keepdim


def _input_dim(graph, name: str, out_dim: int, in_shape: tuple, out_shape: tuple) -> int:
    """The dim of ``name``'s input of shape ``in_shape`` that its output dim ``out_dim``
    comes from: a stack's new dim shifts the later ones by one; a reduction's output dims
    are its input's others; a pointwise op's inputs broadcast from the right."""
    node = graph.decision(name).fx_node
    if _JOINS.get(node.target):
        joined = _joined_dim(graph, name)
        assert joined is not None  # a stack's op joins along a dim
        return out_dim - (out_dim > joined)
    reduced = _reduced_dims(graph, name)
    if reduced is not None:
        dims, keepdim = reduced
        return out_dim if keepdim else [d for d in range(len(in_shape)) if d not in dims][out_dim]
    return out_dim - (len(out_shape) - len(in_shape))


def split_input_gradient(
    graph, name: str, in_shape: tuple, after: tuple, made: tuple, exits, grad: tuple, mesh_shape, operands: dict
) -> tuple:
    """The gradient the pointwise op ``name`` hands an input of shape ``in_shape`` on the
    axes where its output gradient ``after`` stays split (``split_through``): split on
    the input's own dim where the input has the output's size there, partial where the
    input was broadcast along it (autograd sums the gradient over the broadcast dims). A
    stack's input gets it split on the dim the output's split dim came from, a repeat's
    as ``repeated_split`` says, an op of one tensor whose backward reads its gradient
    alone as DTensor's rules make it (``gradient_only_split``)."""
    through = split_through(graph, name, exits, after, made, mesh_shape, operands)
    if not any(through):
        return grad
    node = graph.decision(name).fx_node
    out_shape = tuple(node.meta["val"].shape)
    # The backward runs on the gradient as it comes: where that is whole, so is the input's
    # (Segformer's drop path hands on a gradient whole on dp, split on tp, to the MLP output
    # it read split on dp)
    result = [REPLICATE if after[axis] == REPLICATE else g for axis, g in enumerate(grad)]
    for axis, split in enumerate(through):
        if not split:
            continue
        out_dim = shard_dim(after[axis])
        assert out_dim is not None  # split through: a shard
        if _is_repeat(graph, name):
            result[axis] = repeated_split(node, out_dim, mesh_shape[axis])
            continue
        if not is_elementwise(graph, name) and _joined_dim(graph, name) is None and _reduced_dims(graph, name) is None:
            result[axis] = gradient_only_split(graph, name, after, axis, mesh_shape)
            continue
        dim = _input_dim(graph, name, out_dim, in_shape, out_shape)
        result[axis] = shard(dim) if dim >= 0 and in_shape[dim] == out_shape[out_dim] else PARTIAL
    return tuple(result)


def sliced_gradient(decision, after: tuple, mesh_shape: tuple[int, ...]) -> tuple[tuple, tuple | None]:
    """(the layout DTensor moves the slice ``decision``'s output gradient ``after`` to for
    the slice's backward, ``slice_backward``, which pads it back to the input's size; the
    layout of the padded gradient where DTensor's rule makes it otherwise than by gathering,
    else None: the view's own rule, ``through_view``, says). A split on the sliced dim
    cannot stay there: DTensor's rule for ``slice_backward`` is asked (autoplan's rules
    installed) where it goes. GPT-OSS slices its experts' gate and up apart,
    ``gate_up[..., ::2]``, and their gradients come back split by the sliced dim on tp:
    torch 2.13 gathers that split, torch 2.14 moves it to another dim (an all_to_all) and
    pads the gradient split twice there. Where DTensor cannot say: gathered on the axes
    that split it on the sliced dim (2.13's rule), the others as they come."""
    node = decision.fx_node
    if node.target is not _aten.slice.Tensor:
        return after, None
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % node.meta["val"].dim()
    gathered = tuple(REPLICATE if is_shard(g) and shard_dim(g) == dim else g for g in after)
    if gathered == after:
        return after, None  # nothing to move: the backward pads the gradient as it comes
    asked = _asked_slice_backward(node, dim, after, tuple(mesh_shape))
    if asked is None or asked[0] == gathered:
        return gathered, None
    return asked


def _asked_slice_backward(node, dim: int, after: tuple, mesh_shape: tuple[int, ...]) -> tuple[tuple, tuple] | None:
    """(the layout DTensor's ``slice_backward`` reads the gradient ``after`` of the slice
    ``node`` in, the layout it makes the padded gradient in); None where DTensor cannot say."""
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    value = node.meta.get("val")
    if not isinstance(source, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start")
    end = node.args[3] if len(node.args) > 3 else node.kwargs.get("end")
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    start = 0 if start is None else start
    end = source.shape[dim] if end is None else end
    gradient = dtensor_spec(_query_mesh(mesh_shape), after, value)
    try:
        with overrides.installed():
            made, reads = dtensor_runs(_aten.slice_backward.default, [gradient],
                                       (gradient, list(source.shape), dim, start, end, step))
    except Exception:  # noqa: BLE001  DTensor cannot run it as given: the planner's own rule stands
        return None
    return (tuple(reads[0]), tuple(made)) if len(reads) == 1 else None


def reshaped_gradient(decision, after: tuple) -> tuple:
    """The layout DTensor moves the reshape ``decision``'s output gradient ``after`` to
    before its backward reshapes it back: ``after`` itself where a strategy of the reshape
    makes that layout, else with the fewest axes gathered that leave one a strategy makes
    (DTensor's reshape rule keeps each split it can and replicates the others, rather than
    moving a split to another dim). A score gradient split by heads, reshaped back to
    ``(batch * heads, ...)``, is gathered (T5's attention, where the position bias split
    the scores by heads). Partial axes stay partial: a reshape moves a partial gradient
    as it is. A dim split over several axes is left as it comes: the planned reshape
    strategies hold no such layout to compare with."""
    if decision.fx_node.target not in RESHAPES:
        return after
    split = tuple(REPLICATE if is_partial(g) else g for g in after)
    if splits_a_dim_twice(split):
        return after
    made = {tuple(s.outputs[0]) for s in decision.strategies if len(s.inputs) == 1}
    if not made or split in made:
        return after
    sharded = [axis for axis, g in enumerate(split) if is_shard(g)]
    for count in range(1, len(sharded) + 1):
        for gathered in itertools.combinations(sharded, count):
            target = tuple(REPLICATE if axis in gathered else g for axis, g in enumerate(split))
            if target in made:
                return tuple(g if is_partial(g) else t for g, t in zip(after, target))
    return after
