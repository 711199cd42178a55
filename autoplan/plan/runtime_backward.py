"""The backward ops that read a value the forward saved, as DTensor runs them.

An op's backward reads its output's gradient as it comes back and the operands autograd
saved as they arrived at the op: a move DTensor makes inside the op's forward runs below
autograd, so the operand is saved unmoved. Where either is laid out otherwise than the
forward read or made it, DTensor picks, op by op, what the backward moves, and that need
not be what the planner's own rules (``plan/gradient_rules.py``) assume: Segformer's MLP
gathers the smaller gradient rather than its weight once more. DTensor's propagation
is asked here, as ``runtime_choice.py`` asks it for the forward's ops and for the
backward's ops on gradients only: a matrix product's backward products
(``product_backward``; an experts' grouped one, ``grouped_backward_moves``), an
embedding's weight gradient (``embedding_backward``), an elementwise product's or
quotient's (``elementwise_backward``), a pointwise op's that reads its saved result
(``saved_value_backward``) and a variance's recomputed mean (``recentred_mean_moves``).
``plan/collectives.py`` counts the moves they answer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.utils._pytree import tree_flatten

from autoplan.choices.decision import Decision
from autoplan.choices.graph import OP, is_tensor_input, planning_mesh
from autoplan.dtensor import overrides
from autoplan.dtensor.strategies import is_pointwise, tensor_meta
from autoplan.placements import (
    PARTIAL_AVG,
    REPLICATE,
    Spec,
    is_partial,
    is_shard,
    runtime_placements,
    shard,
    shard_dim,
)
from autoplan.plan.gradient_rules import broadcast_dims
from autoplan.plan.runtime_choice import dtensor_runs, dtensor_spec
from autoplan.trace.backward_run import backward_run


def grouped_backward_moves(decision: Decision, grad: Spec, saved: dict[int, Spec], mesh: DeviceMesh) -> list | None:
    """The moves of its saved operands, ``(input index, saved layout, layout read)``, where
    DTensor runs the backward of the experts' grouped matrix product ``decision``
    (``_grouped_mm(x, w, offs)``, ``x`` 2-D, ``w`` 3-D) on its output's gradient ``grad``
    partial as it comes; None where it reduces the gradient on some axis (or cannot say).
    Its two products are ``grad @ w.T``, per group, and ``grad.T @ x``; each keeps the
    gradient partial where DTensor moves the saved operand instead (Qwen2-MoE: the weight
    saved split by the contracted dim on tp costs the same to gather as the gradient to
    reduce-scatter, and DTensor gathers it). ``saved``: input index -> the layout autograd
    saved it in."""
    node = decision.fx_node
    if node.target is not torch.ops.aten._grouped_mm.default or len(node.args) < 3 or 0 not in saved or 1 not in saved:
        return None
    values = _all_tensors(*(arg.meta.get("val") if isinstance(arg, fx.Node) else None for arg in node.args[:3]),
                          node.meta.get("val"))
    if values is None or values[0].dim() != 2 or values[1].dim() != 3:
        return None
    x, w, offs, out = values
    offs_spec = (REPLICATE,) * len(grad)
    asks = (  # (the product's operands, their layouts, the input index of the saved one it reads)
        ((out, w.transpose(-2, -1), offs), (grad, _transposed(saved[1], 3), offs_spec), 1),
        ((out.t(), x, offs), (_transposed(grad, 2), saved[0], offs_spec), 0),
    )
    moves = []
    op = torch.ops.aten._grouped_mm.default
    for tensors, layouts, index in asks:
        specs = [dtensor_spec(mesh, s, t) for t, s in zip(tensors, layouts)]
        try:
            _, reads = dtensor_runs(op, specs)
        except Exception:  # DTensor cannot run it as given: the planner's own rule stands
            return None
        if any(p != r for p, r in zip(grad if index == 1 else layouts[0], reads[0])):
            return None  # the gradient moves (is reduced): the planner's own rule stands
        if reads[1] != layouts[1]:  # the saved operand moved, in its own dims
            moves.append((index, saved[index], _transposed(reads[1], 3) if index == 1 else reads[1]))
    return moves


_PRODUCTS: dict[object, int] = {
    torch.ops.aten.mm.default: 0, torch.ops.aten.addmm.default: 1, torch.ops.aten.bmm.default: 0,
    torch.ops.aten._grouped_mm.default: 0,
}
"""Matrix products -> the argument index of their first matrix operand."""


_ASKED_WHOLE = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
"""Matrix products whose backward is asked of DTensor for every operand where their
output's gradient comes in another layout than they made it (``runs_product_backward``)."""


def runs_product_backward(decision: Decision, grad: Spec, made: Spec) -> bool:
    """Whether DTensor is asked how the backward of the matrix product ``decision`` (``mm``,
    ``bmm``) runs, for each operand (``product_backward``): where its output's gradient comes
    in another layout than the product made it, DTensor runs each backward product on the
    gradient as it comes and the other operand as saved, and picks which of the two it
    moves (Llama 4's experts, a ``bmm`` per expert made split by expert on dp, get their
    gradient split by rows on dp and by expert on tp: DTensor gathers the saved input for
    the weight's gradient rather than move the larger gradient)."""
    node = decision.fx_node
    return decision.kind == OP and node.target in _ASKED_WHOLE and tuple(grad) != tuple(made)


def product_backward(
    decision: Decision, k: int, grad: Spec, operands: dict[int, tuple[Spec, Spec]], mesh: DeviceMesh, made: Spec | None = None
):
    """DTensor's backward product for operand ``k`` of the matrix product ``decision``
    (``grad @ b.T`` for ``a``, ``a.T @ grad`` for ``b``) with the output gradient laid out
    ``grad`` and the other operand as autograd saved it: ``(the gradient's layout, [(which,
    layout before, layout read)])``, ``which`` being ``"gradient"`` or the other operand's
    input index. Only where DTensor moved that operand inside the forward product (below
    autograd, so autograd saved it unmoved) and the backward moves it, or the gradient,
    otherwise than again the same way (a repeat of the forward's move is kept,
    ``dtensor/saved_inputs.py``, and the planner's own rules hold): Segformer's MLP output
    projection gathers its weight on tp inside the forward product, and its backward
    gathers the smaller gradient instead (Llama 4's experts, a ``bmm`` per expert, alike);
    an experts' grouped product (Zaya's, Beam's
    down projection) gathers its weight split by the contracted dim on tp inside the
    forward, and its backward runs on the weight as saved, handing the input a gradient
    split by that dim. Also wherever DTensor is asked the whole backward
    (``runs_product_backward``, given the layout the product ``made``), a kept move not
    listed. None elsewhere, or where DTensor cannot say; for a grouped product also where
    the gradient comes partial (``grouped_backward_moves`` answers there).
    ``operands``: input index -> (the layout autograd saved it in, the layout the op read it in)."""
    node = decision.fx_node
    first = _PRODUCTS.get(node.target)
    if decision.kind != OP or first is None or k not in (first, first + 1):
        return None
    other = first + 1 if k == first else first
    whole = made is not None and runs_product_backward(decision, grad, made)
    if other not in operands or (operands[other][0] == operands[other][1] and not whole):
        return None
    saved, read = operands[other]
    asked = _backward_product_operands(node, first, k, grad, saved)
    if asked is None:
        return None
    op, tensors, layouts, at, transposed = asked
    specs = [dtensor_spec(mesh, s, t) for t, s in zip(tensors, layouts)]
    try:
        result, reads = dtensor_runs(op, specs)
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    operand_read = _transposed(reads[at], transposed) if transposed else reads[at]
    kept = operand_read == read  # as the forward read it: no move, or the forward's, kept
    if kept and not whole:
        return None  # the planner's own rules assume the forward's reads
    gradient_read = reads[1 - at]
    if node.target is torch.ops.aten._grouped_mm.default and k != first:
        # the weight's gradient is made transposed (``grad.T @ x``, per group)
        result, gradient_read = _transposed(result, 3), _transposed(gradient_read, 2)
    elif _made_transposed(node, first, k):
        # autograd made this operand's gradient as the transpose of a product of the
        # gradient transposed (``_plain_backward_product``)
        result, gradient_read = _transposed(result, 2), _transposed(gradient_read, 2)
    return result, [("gradient", grad, gradient_read)] + ([] if kept else [(other, saved, operand_read)])


def embedding_backward(decision: Decision, k: int, grad: Spec, operands: dict[int, tuple[Spec, Spec]], mesh: DeviceMesh):
    """DTensor's ``embedding_dense_backward`` for the weight (``k`` 0) of the embedding
    ``decision`` with the output gradient laid out ``grad`` and the indices as autograd
    saved them, in ``product_backward``'s form: ``(the weight gradient's layout, [(which,
    layout before, layout read)])``. Only where DTensor moved the indices inside the forward
    (below autograd, so autograd saved them unmoved): MobileBERT's embedding reads its
    weight as stored (tied to the decoder, no hook gathers it), so DTensor gathers the
    token ids split by batch on tp to run it whole; its backward runs on the ids as
    saved, slices the whole gradient to them and hands the weight a gradient partial on tp.
    None elsewhere, or where DTensor cannot say."""
    node = decision.fx_node
    if decision.kind != OP or node.target is not torch.ops.aten.embedding.default or k != 0 or 1 not in operands:
        return None
    saved, read = operands[1]
    values = _all_tensors(_recorded(node.args[0]), _recorded(node.args[1]), node.meta.get("val"))
    if saved == read or values is None:
        return None
    weight, indices, out = values
    padding_idx = node.args[2] if len(node.args) > 2 else -1
    scale_grad_by_freq = node.args[3] if len(node.args) > 3 else False
    specs = [dtensor_spec(mesh, grad, out), dtensor_spec(mesh, saved, indices)]
    try:
        result, reads = dtensor_runs(
            torch.ops.aten.embedding_dense_backward.default, specs,
            (*specs, weight.shape[0], padding_idx, scale_grad_by_freq),
        )
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    return result, [("gradient", grad, reads[0]), (1, saved, reads[1])]


def index_backward_read(decision: Decision, grad: Spec, operands: dict[int, tuple[Spec, Spec]], mesh: DeviceMesh):
    """The layout DTensor reads the output gradient ``grad`` of the ``index`` ``decision``
    in for its backward, an accumulating ``index_put`` of the gradient into zeros of the
    source's shape (made whole) at the indices as autograd saved them; None where it is not
    asked (another op, a gradient split nowhere) or DTensor cannot say. GPT-OSS picks its
    experts' biases by expert (``bias[expert_ids]``): torch 2.14's rule reads a gradient
    split twice by rows in the bias's own split (by columns on tp), where a whole read
    would gather it."""
    node = decision.fx_node
    if decision.kind != OP or node.target is not torch.ops.aten.index.Tensor or not any(is_shard(p) for p in grad):
        return None
    source, out = node.args[0], node.meta.get("val")
    indices = node.args[1] if len(node.args) > 1 else None
    if not isinstance(source, fx.Node) or not isinstance(indices, (list, tuple)) or not isinstance(out, torch.Tensor):
        return None
    if not all(isinstance(i, fx.Node) for i in indices):
        return None  # an index left out (``x[:, ids]``): not asked
    values = _all_tensors(_recorded(source), *(_recorded(i) for i in indices))
    if values is None:
        return None
    whole = tuple(REPLICATE for _ in grad)
    zeros = dtensor_spec(mesh, whole, values[0])
    saved = [dtensor_spec(mesh, operands.get(k + 1, (whole,))[0], value) for k, value in enumerate(values[1:])]
    gradient = dtensor_spec(mesh, grad, out)
    try:
        with overrides.installed():
            _, reads = dtensor_runs(torch.ops.aten.index_put.default, [zeros, *saved, gradient], (zeros, saved, gradient, True))
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    return reads[-1] if len(reads) == len(values) + 1 else None


def _backward_product_operands(node: fx.Node, first: int, k: int, grad: Spec, saved: Spec):
    """``(op, operands, their layouts, the position of the saved operand, its dims where
    the product reads it transposed, else 0)`` of the backward product that makes operand
    ``k``'s gradient of the matrix product ``node``, as autograd runs it; None for shapes
    it is not asked of."""
    values = _all_tensors(_recorded(node.args[first]), _recorded(node.args[first + 1]), node.meta.get("val"))
    if values is None:
        return None
    a, b, out = values
    if node.target is torch.ops.aten.bmm.default:  # per batch: its backward products are bmms too
        return _plain_backward_product(torch.ops.aten.bmm.default, 3, a, b, out, first, k, grad, saved)
    if node.target is not torch.ops.aten._grouped_mm.default:
        return _plain_backward_product(torch.ops.aten.mm.default, 2, a, b, out, first, k, grad, saved)
    offs = node.args[2].meta.get("val") if len(node.args) > 2 and isinstance(node.args[2], fx.Node) else None
    if a.dim() != 2 or b.dim() != 3 or not isinstance(offs, torch.Tensor) or any(is_partial(p) for p in grad):
        return None
    whole = (REPLICATE,) * len(grad)
    op = torch.ops.aten._grouped_mm.default
    if k == first:  # ``grad @ w.T``, per group
        return op, (out, b.transpose(-2, -1), offs), (grad, _transposed(saved, 3), whole), 1, 3
    return op, (out.t(), a, offs), (_transposed(grad, 2), saved, whole), 1, 0  # ``grad.T @ x``, per group


def _column_major(t: torch.Tensor) -> bool:
    """Whether the 2-D ``t`` is laid out column by column (a transpose of a contiguous
    matrix: a linear layer's weight as ``mm`` reads it)."""
    return t.dim() == 2 and t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _made_transposed(node: fx.Node, first: int, k: int) -> bool:
    """Whether autograd makes operand ``k``'s gradient of the 2-D matrix product ``node``
    as the transpose of a product of the gradient transposed: it does so for an operand
    laid out column by column, to hand its gradient back in that order (``mm``'s
    derivative formula: ``(grad.T @ a).T`` for such a ``b``, ``(b @ grad.T).T`` for such
    an ``a``)."""
    if node.target not in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return False
    value = _recorded(node.args[k]) if k in (first, first + 1) else None
    return isinstance(value, torch.Tensor) and _column_major(value)


def _plain_backward_product(op, dims: int, a, b, out, first: int, k: int, grad: Spec, saved: Spec):
    """``_backward_product_operands`` of a product of ``dims``-D operands (``mm``, ``bmm``):
    ``grad @ b.T`` for ``a``, ``a.T @ grad`` for ``b``; for an ``mm`` operand laid out
    column by column, the transposes autograd runs instead (``_made_transposed``: the
    product's result and the gradient's read are transposed back by ``product_backward``),
    where DTensor may move the other of two equal-cost operands (Longformer's attention
    output projection: torch 2.14 gathers the saved input of ``grad.T @ x`` on tp where
    2.13 gathered the gradient, and hands the weight's gradient split by its other dim)."""
    if any(t.dim() != dims for t in (a, b, out)):
        return None
    if op is torch.ops.aten.mm.default and _column_major(a if k == first else b):
        if k == first:  # ``(b @ grad.T).T``
            return op, (b, out.t()), (saved, _transposed(grad, 2)), 0, 0
        return op, (out.t(), a), (_transposed(grad, 2), saved), 1, 0  # ``(grad.T @ a).T``
    if k == first:
        return op, (out, b.transpose(-2, -1)), (grad, _transposed(saved, dims)), 1, dims
    return op, (a.transpose(-2, -1), out), (_transposed(saved, dims), grad), 0, dims


_ELEMENTWISE_PRODUCTS = (torch.ops.aten.mul.Tensor, torch.ops.aten.div.Tensor)
"""Ops whose backward is ``grad`` times (or over) the other operand as saved (``elementwise_backward``)."""


ASKED_PRODUCTS = frozenset((*_ELEMENTWISE_PRODUCTS, *_ASKED_WHOLE))
"""Products whose backward is asked of DTensor where their output's gradient comes in
another layout than they made it (``runs_elementwise_backward``, ``runs_product_backward``)."""


def runs_elementwise_backward(decision: Decision, grad: Spec, made: Spec) -> bool:
    """Whether the backward of ``decision``, a product ``a * b`` (or quotient ``a / b``)
    of two operands of its output's shape or broadcast to it, is asked of DTensor
    (``elementwise_backward``): where its output's gradient comes in another layout than
    the product made it. Each input's gradient is then ``grad * other``, run on the
    gradient as it comes and the other operand as saved, and DTensor picks which of the
    two it moves (Llama 4's experts, ``up * act(gate)`` made split by expert on dp and
    partial on tp, get its gradient partial on dp and split by expert on tp: for
    ``act(gate)``'s gradient DTensor moves the gradient to ``up``'s layout, for ``up``'s it
    reduce-scatters the gradient to ``act(gate)``'s split); a broadcast operand's gradient
    is that product summed over the dims it was broadcast along."""
    node = decision.fx_node
    if decision.kind != OP or node.target not in _ELEMENTWISE_PRODUCTS or tuple(grad) == tuple(made):
        return False
    out = node.meta.get("val")
    operands = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args[:2]]
    return isinstance(out, torch.Tensor) and all(
        isinstance(t, torch.Tensor) and _broadcasts_to(tuple(t.shape), tuple(out.shape)) for t in operands
    )


def _broadcasts_to(shape: tuple, out: tuple) -> bool:
    return len(shape) <= len(out) and all(s in (1, o) for s, o in zip(reversed(shape), reversed(out)))


def elementwise_backward(decision: Decision, k: int, grad: Spec, operands: dict[int, tuple[Spec, Spec]], mesh: DeviceMesh):
    """DTensor's ``grad * other`` for input ``k`` of the product ``decision`` where its
    backward is asked of DTensor (``runs_elementwise_backward``): ``(the gradient's
    layout, [(which, layout before, layout read)])`` as ``product_backward`` says them. A
    move of the other operand the forward made the same way is kept
    (``dtensor/saved_inputs.py``): not listed. A quotient's numerator gets ``grad / b``,
    its denominator ``-grad * ((a / b) / b)``, the quotient made again from the saved
    operands (DeBERTa's layer norm divides by a standard deviation whole on dp a centred
    input partial there: the gradient comes split, and DTensor reduce-scatters the
    quotient to it). Where input ``k`` was broadcast, autograd sums the product over the
    broadcast dims (kept, then viewed away), as DTensor's sum runs it: DeBERTa's layer
    norm scales by a weight split on dp along the hidden dim, and its gradient, made
    partial, is all-reduced by that sum. None where DTensor cannot say.
    ``operands``: input index -> (the layout autograd saved it in, the layout the op read it in)."""
    node = decision.fx_node
    other = 1 - k
    if k not in (0, 1) or other not in operands:
        return None
    saved, read = operands[other]
    values = _all_tensors(node.meta.get("val"), _recorded(node.args[k]), _recorded(node.args[other]))
    if values is None:  # DTensor cannot run it either
        return None
    out, mine, theirs = values

    moves: list[tuple[int | str, Spec, Spec]] = []
    try:
        if node.target is torch.ops.aten.div.Tensor and k == 1:
            # ``-grad * ((a / b) / b)``: the quotient made again from the saved operands
            if 0 not in operands:
                return None
            div = node.target
            quotient, (a_read, b_read) = dtensor_runs(
                div, [dtensor_spec(mesh, operands[0][0], theirs), dtensor_spec(mesh, saved, mine)]
            )
            again, _ = dtensor_runs(div, [dtensor_spec(mesh, quotient, out), dtensor_spec(mesh, b_read, mine)])
            moves += [(index, operands[index][0], r) for index, r in ((0, a_read), (1, b_read)) if r != operands[index][1]]
            mul = torch.ops.aten.mul.Tensor
            result, (gradient_read, again_read) = dtensor_runs(
                mul, [dtensor_spec(mesh, grad, out), dtensor_spec(mesh, again, out)]
            )
            moves.append(("gradient", again, again_read))
        else:  # ``grad * other``, ``grad / other``: the op itself
            result, (gradient_read, operand_read) = dtensor_runs(
                node.target, [dtensor_spec(mesh, grad, out), dtensor_spec(mesh, saved, theirs)]
            )
            if operand_read != read:
                moves.append((other, saved, operand_read))
        summed = _summed_to(result, tuple(out.shape), tuple(mine.shape), mesh, tensor_meta(out))
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    if summed is None:
        return None
    layout, sum_moves = summed
    return layout, [("gradient", grad, gradient_read)] + moves + sum_moves


def _summed_to(layout: Spec, out: tuple, shape: tuple, mesh: DeviceMesh, meta) -> tuple[Spec, list] | None:
    """A gradient laid out ``layout`` of an output of shape ``out`` summed to an input of
    ``shape`` as autograd does (``sum(dims, keepdim=True)`` over the dims broadcast, then
    a view without the leading ones): (its layout, [("gradient", layout before, read)] for
    DTensor's move of it); None where a leading dim stays split."""
    lead = len(out) - len(shape)
    dims = sorted(broadcast_dims(shape, out))
    if not dims:
        return layout, []
    spec = DTensorSpec(mesh, runtime_placements(layout), tensor_meta=meta)
    made, (read,) = dtensor_runs(torch.ops.aten.sum.dim_IntList, [spec], (spec, dims, True))
    if any((d := shard_dim(p)) is not None and d < lead for p in made):
        return None
    viewed = tuple(shard(d - lead) if (d := shard_dim(p)) is not None else p for p in made)
    return viewed, ([("gradient", layout, read)] if read != layout else [])


def averaged_product_sum(node: fx.Node, in_shape: tuple, product: Spec, mesh_shape: tuple[int, ...]) -> tuple[Spec, Spec] | None:
    """(the layout DTensor reads the full-size ``product`` of the elementwise op ``node`` in,
    to sum it over the dims its input of shape ``in_shape`` was broadcast along; the layout
    of that sum as the input's gradient) where ``product`` is partial by average on the axes
    marked partial (``x - mean(x)`` averaged-partial, times the output's gradient). A sum
    does not take an average partial as it is; which layout DTensor moves it to first is
    its rule's choice: torch 2.13 reduces it and gathers a split of a summed dim first,
    torch 2.14 reduces it and sums such a split to a partial. None where DTensor
    cannot say or a leading dim stays split (``gradient_rules.averaged_product_summed``'s
    rule stands)."""
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not any(is_partial(p) for p in product):
        return None
    lead = out.dim() - len(in_shape)
    dims = sorted(broadcast_dims(tuple(in_shape), tuple(out.shape)))
    averaged = tuple(PARTIAL_AVG if is_partial(p) else p for p in product)
    spec = DTensorSpec(_query_mesh(tuple(mesh_shape)), runtime_placements(averaged), tensor_meta=tensor_meta(out))
    try:
        with overrides.installed():
            made, (read,) = dtensor_runs(torch.ops.aten.sum.dim_IntList, [spec], (spec, dims, True))
    except Exception:  # DTensor cannot run it as given: the planner's own rule stands
        return None
    if any((d := shard_dim(p)) is not None and d < lead for p in made):
        return None
    return read, tuple(shard(d - lead) if (d := shard_dim(p)) is not None else p for p in made)


@functools.cache
def _query_mesh(mesh_shape: tuple[int, ...]) -> DeviceMesh:
    return planning_mesh(mesh_shape, tuple(f"axis{axis}" for axis in range(len(mesh_shape))))


def runs_saved_value_backward(decision: Decision, grad: Spec, made: Spec) -> bool:
    """Whether the backward of ``decision``, an elementwise op of one tensor whose backward
    is one pointwise op of the gradient and one value saved at the output's shape
    (``sigmoid``'s ``sigmoid_backward(grad, result)``, ``exp``'s ``grad * result``), is
    asked of DTensor (``saved_value_backward``): where the gradient comes laid out
    otherwise than the op made its output, neither partial (DTensor reduces a partial
    gradient before most such ops: ``plan/backward_ops.py``)."""
    node = decision.fx_node
    if decision.kind != OP or tuple(grad) == tuple(made) or not is_pointwise(node.target):
        return False
    if any(is_partial(p) for p in (*grad, *made)):
        return False
    out = node.meta.get("val")
    tensors = [a.meta.get("val") for a in tree_flatten((node.args, node.kwargs))[0] if is_tensor_input(a)]
    if not isinstance(out, torch.Tensor) or len(tensors) != 1 or tuple(tensors[0].shape) != tuple(out.shape):
        return False
    step = _saved_value_step(node)
    return step is not None and step.operands == 2 and len(step.gradient_positions) == 1 and is_pointwise(step.op)


def _saved_value_step(node: fx.Node):
    """The one op of ``node``'s backward that reads the gradient, where the others only
    detach the saved values it reads; else None."""
    run = backward_run(node)
    if run is None:
        return None
    steps = [read for read in run if read.gradient_positions]
    others = [read for read in run if not read.gradient_positions]
    if len(steps) != 1 or any(read.op not in _UNPACKING for read in others):
        return None
    return steps[0]


_UNPACKING = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)
"""What autograd runs on a saved value as it hands it to a backward."""


def saved_value_backward(decision: Decision, grad: Spec, made: Spec, mesh: DeviceMesh):
    """DTensor's backward op for ``decision`` where it is asked (``runs_saved_value_backward``):
    ``(the input gradient's layout, [(which, layout before, layout read)])``, ``which``
    being ``"gradient"`` or ``"saved"`` (the value autograd saved, laid out as the op made
    its output). Kimi Linear's gated norm takes ``sigmoid`` of its gate, made split by
    heads, and reads it split by tokens; the gradient comes back split by tokens, and
    DTensor runs ``sigmoid_backward`` there, moving the saved result as the forward did
    (a move ``dtensor/saved_inputs.py`` keeps). None where DTensor cannot say."""
    node = decision.fx_node
    step = _saved_value_step(node)
    at = step.gradient_positions[0]
    value = node.meta["val"]
    specs = [dtensor_spec(mesh, grad if i == at else made, value) for i in range(2)]
    try:
        result, reads = dtensor_runs(step.op, specs)
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    moves = [("gradient", grad, reads[at]), ("saved", made, reads[1 - at])]
    return result, [(which, before, read) for which, before, read in moves if read != before]


_RECENTRED = (torch.ops.aten.var.correction, torch.ops.aten.std.correction)
"""Reductions whose backward recomputes the mean of their input: ``grad * (x - x.mean(dims))``."""


def recentred_mean_moves(decision: Decision, saved: Spec | None, mesh: DeviceMesh) -> list | None:
    """The moves ``[(which, layout before, layout read, bytes, shape)]`` (``which``: ``"input"``
    or ``"mean"``) of the subtraction ``x - x.mean(dims, keepdim=True)`` that the backward
    of a variance (or standard deviation) ``decision`` runs on its input as autograd saved
    it (``saved``). Split on a reduced dim, the mean is partial there, and DTensor picks
    what the subtraction moves: the small mean all-reduced, or the input gathered. DTensor
    gathers such an input inside the forward, below autograd, so the split is what the
    backward reads (Gemma 3n's activation sparsity takes the standard deviation of its
    MLP's gate split by hidden on dp). None where nothing is partial or DTensor cannot say."""
    node = decision.fx_node
    if decision.kind != OP or node.target not in _RECENTRED or saved is None:
        return None
    x = _recorded(node.args[0])
    if not isinstance(x, torch.Tensor):
        return None
    dims: Any = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")  # the schema's int[1]? dim
    reduced = {d % x.dim() for d in dims} if dims else set(range(x.dim()))
    mean = tuple(PARTIAL_AVG if is_shard(p) and shard_dim(p) in reduced else p for p in saved)
    if not any(is_partial(p) for p in mean):
        return None
    mean_value = torch.empty([1 if d in reduced else n for d, n in enumerate(x.shape)], dtype=x.dtype, device="meta")
    specs = [dtensor_spec(mesh, s, t) for s, t in ((saved, x), (mean, mean_value))]
    op = torch.ops.aten.sub.Tensor
    try:
        _, reads = dtensor_runs(op, specs)
    except Exception:  # DTensor cannot run it as given: nothing to add
        return None
    return [
        (which, before, read, value.numel() * value.element_size(), tuple(value.shape))
        for which, before, read, value in zip(("input", "mean"), (saved, mean), reads, (x, mean_value))
    ]


def _transposed(spec: Spec, dims: int) -> Spec:
    """The layout of a tensor of ``dims`` dims laid out ``spec``, as its transpose of the
    last two dims is laid out (the same the other way)."""
    last = (dims - 2, dims - 1)
    return tuple(shard(2 * dims - 3 - d) if (d := shard_dim(p)) is not None and d in last else p for p in spec)


def _recorded(arg: fx.node.Argument) -> object:
    """The value tracing recorded for ``arg``, an operand the op reads as a tensor (a node)."""
    assert isinstance(arg, fx.Node), arg
    return arg.meta.get("val")


def _all_tensors(*values: object) -> tuple[torch.Tensor, ...] | None:
    """``values`` where each is a tensor, else None."""
    tensors = tuple(v for v in values if isinstance(v, torch.Tensor))
    return tensors if len(tensors) == len(values) else None
