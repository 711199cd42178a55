"""The strategy DTensor runs for an op of a plan, given the layouts its inputs arrive in.

The plan picks one strategy per op; at run time DTensor picks its own, op by op, from the
layouts the inputs arrive in: the cheapest moves, the first of equals. Mostly the two
agree. Where they do not, the collectives that run are DTensor's, and so is the layout
the op's output leaves in: an add of a value split on dim 2 and one split on dim 0 moves
either one, at the same cost, and where the plan moved the second DTensor moves the
first; a view runs on its input as it arrives; a rule that follows one input offers
only what that input's layout allows. ``runtime_strategy`` asks DTensor's own propagation
(autoplan's rules installed, as while a planned model runs, and outside every cache: the
question is asked on a planning mesh) which strategy it will run.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.choices.decision import Decision
from autoplan.choices.graph import OP, is_tensor_input
from autoplan.dtensor import loss_parallel, overrides
from autoplan.dtensor.strategies import Strategy, is_pointwise, runtime_schema_info, tensor_meta
from autoplan.placements import (
    PARTIAL_AVG, REPLICATE, Spec, is_partial, is_shard, runtime_placements, runtime_spec, shard, shard_dim,
    spec_from_placements,
)
from autoplan.plan.gradient_rules import broadcast_dims
from autoplan.trace.backward_run import backward_run, gradient_makers, input_gradients, signature


def runtime_strategy(decision: Decision, arrived: list[Spec], mesh: DeviceMesh) -> Strategy | None:
    """DTensor's strategy for ``decision``'s op with its tensor inputs arriving in
    ``arrived`` (in the choice graph's input order); None where DTensor cannot say (no
    rule, a layout outside the planner's vocabulary): the plan's strategy stands."""
    node = decision.fx_node
    op = node.target
    if decision.kind != OP or not isinstance(op, torch._ops.OpOverload):
        return None
    split = loss_parallel.runtime_layout(node, arrived, lambda whole: _propagated(node, op, whole, mesh))
    if split is not None:  # cross-entropy on logits split by class: autoplan's handlers run it
        return Strategy(*split)
    found = _propagated(node, op, arrived, mesh)
    return Strategy(*found) if found is not None else None


def _propagated(node: fx.Node, op, arrived: list[Spec], mesh: DeviceMesh) -> tuple[tuple, tuple] | None:
    """DTensor's (outputs, inputs) for ``node`` with its inputs arriving in ``arrived``."""
    layouts = iter(arrived)

    def spec_of(arg):
        if is_tensor_input(arg):
            return _spec(mesh, next(layouts), arg.meta["val"])
        return arg.meta.get("val") if isinstance(arg, fx.Node) else arg

    try:
        args, kwargs = tree_map(spec_of, (node.args, node.kwargs), is_leaf=lambda a: isinstance(a, fx.Node))
        schema = OpSchema(op, args, kwargs, schema_info=runtime_schema_info(op))
        sharding = overrides.propagate_uncached(schema)
        out = sharding.output_spec
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outputs = tuple(None if s is None else runtime_spec(s.placements) for s in outs)
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else ()
        inputs = tuple(runtime_spec(s.placements) for s in wanted) + tuple(arrived[len(wanted):])
    except Exception:  # DTensor cannot run it as given: the plan's own strategy (a fallback) runs
        return None
    if len(inputs) != len(arrived) or not outputs:
        return None
    return outputs, inputs


JOINS = (torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default)
"""Splits whose backward is a ``cat`` of their outputs' gradients."""


def joined_gradient(decision: Decision, parts: list[Spec | None], mesh: DeviceMesh) -> tuple[Spec, list[Spec]] | None:
    """DTensor's ``cat`` of the split ``decision``'s output gradients, laid out as they come
    (``parts``, one per output): (the joined gradient's layout, the layout it reads each part
    in). The backward joins the parts as they arrive, moving each only as far as the cat's
    rule asks: MPT's fused q/k/v projection, chunked in three, gets its query's gradient
    split by rows on dp, its key's partial there and its value's whole, and the cat keeps the
    split, reduce-scattering the key's. None where DTensor cannot say, or a part has no
    gradient (autograd joins zeros for it)."""
    node = decision.fx_node
    if decision.kind != OP or node.target not in JOINS or any(p is None for p in parts):
        return None
    values = node.meta.get("val")
    if not isinstance(values, (tuple, list)) or len(values) != len(parts):
        return None
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    specs = [_spec(mesh, p, v) for p, v in zip(parts, values)]
    op = torch.ops.aten.cat.default
    try:
        joined, reads = _dtensor_runs(op, specs, (specs, dim))
    except Exception:  # DTensor cannot join them as given: the planner's own rule stands
        return None
    return (joined, reads) if len(reads) == len(parts) else None


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
    x, w, offs = (arg.meta.get("val") if isinstance(arg, fx.Node) else None for arg in node.args[:3])
    out = node.meta.get("val")
    if any(not isinstance(t, torch.Tensor) for t in (x, w, offs, out)) or x.dim() != 2 or w.dim() != 3:
        return None
    offs_spec = (REPLICATE,) * len(grad)
    asks = (  # (the product's operands, their layouts, the input index of the saved one it reads)
        ((out, w.transpose(-2, -1), offs), (grad, _transposed(saved[1], 3), offs_spec), 1),
        ((out.t(), x, offs), (_transposed(grad, 2), saved[0], offs_spec), 0),
    )
    moves = []
    op = torch.ops.aten._grouped_mm.default
    for tensors, layouts, index in asks:
        specs = [_spec(mesh, s, t) for t, s in zip(tensors, layouts)]
        try:
            _, reads = _dtensor_runs(op, specs)
        except Exception:  # DTensor cannot run it as given: the planner's own rule stands
            return None
        if any(p != r for p, r in zip(grad if index == 1 else layouts[0], reads[0])):
            return None  # the gradient moves (is reduced): the planner's own rule stands
        if reads[1] != layouts[1]:  # the saved operand moved, in its own dims
            moves.append((index, saved[index], _transposed(reads[1], 3) if index == 1 else reads[1]))
    return moves


_PRODUCTS = {
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
    specs = [_spec(mesh, s, t) for t, s in zip(tensors, layouts)]
    try:
        result, reads = _dtensor_runs(op, specs)
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
    weight, indices, out = (node.args[0].meta.get("val"), node.args[1].meta.get("val"), node.meta.get("val"))
    if saved == read or any(not isinstance(t, torch.Tensor) for t in (weight, indices, out)):
        return None
    padding_idx = node.args[2] if len(node.args) > 2 else -1
    scale_grad_by_freq = node.args[3] if len(node.args) > 3 else False
    specs = [_spec(mesh, grad, out), _spec(mesh, saved, indices)]
    try:
        result, reads = _dtensor_runs(
            torch.ops.aten.embedding_dense_backward.default, specs,
            (*specs, weight.shape[0], padding_idx, scale_grad_by_freq),
        )
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    return result, [("gradient", grad, reads[0]), (1, saved, reads[1])]


def _backward_product_operands(node: fx.Node, first: int, k: int, grad: Spec, saved: Spec):
    """``(op, operands, their layouts, the position of the saved operand, its dims where
    the product reads it transposed, else 0)`` of the backward product that makes operand
    ``k``'s gradient of the matrix product ``node``, as autograd runs it; None for shapes
    it is not asked of."""
    a, b, out = (node.args[first].meta.get("val"), node.args[first + 1].meta.get("val"), node.meta.get("val"))
    if any(not isinstance(t, torch.Tensor) for t in (a, b, out)):
        return None
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


def _plain_backward_product(op, dims: int, a, b, out, first: int, k: int, grad: Spec, saved: Spec):
    """``_backward_product_operands`` of a product of ``dims``-D operands (``mm``, ``bmm``):
    ``grad @ b.T`` for ``a``, ``a.T @ grad`` for ``b``."""
    if any(t.dim() != dims for t in (a, b, out)):
        return None
    if k == first:
        return op, (out, b.transpose(-2, -1)), (grad, _transposed(saved, dims)), 1, dims
    return op, (a.transpose(-2, -1), out), (_transposed(saved, dims), grad), 0, dims


_ELEMENTWISE_PRODUCTS = (torch.ops.aten.mul.Tensor, torch.ops.aten.div.Tensor)
"""Ops whose backward is ``grad`` times (or over) the other operand as saved (``elementwise_backward``)."""


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
    out, mine, theirs = node.meta.get("val"), node.args[k].meta.get("val"), node.args[other].meta.get("val")

    moves = []
    try:
        if node.target is torch.ops.aten.div.Tensor and k == 1:
            # ``-grad * ((a / b) / b)``: the quotient made again from the saved operands
            if 0 not in operands:
                return None
            div = node.target
            quotient, (a_read, b_read) = _dtensor_runs(div, [_spec(mesh, operands[0][0], theirs), _spec(mesh, saved, mine)])
            again, _ = _dtensor_runs(div, [_spec(mesh, quotient, out), _spec(mesh, b_read, mine)])
            moves += [(index, operands[index][0], r) for index, r in ((0, a_read), (1, b_read)) if r != operands[index][1]]
            mul = torch.ops.aten.mul.Tensor
            result, (gradient_read, again_read) = _dtensor_runs(mul, [_spec(mesh, grad, out), _spec(mesh, again, out)])
            moves.append(("gradient", again, again_read))
        else:  # ``grad * other``, ``grad / other``: the op itself
            result, (gradient_read, operand_read) = _dtensor_runs(node.target, [_spec(mesh, grad, out), _spec(mesh, saved, theirs)])
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
    made, (read,) = _dtensor_runs(torch.ops.aten.sum.dim_IntList, [spec], (spec, dims, True))
    if any(is_shard(p) and shard_dim(p) < lead for p in made):
        return None
    viewed = tuple(shard(shard_dim(p) - lead) if is_shard(p) else p for p in made)
    return viewed, ([("gradient", layout, read)] if read != layout else [])


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
    specs = [_spec(mesh, grad if i == at else made, node.meta["val"]) for i in range(2)]
    try:
        result, reads = _dtensor_runs(step.op, specs)
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    moves = [("gradient", grad, reads[at]), ("saved", made, reads[1 - at])]
    return result, [(which, before, read) for which, before, read in moves if read != before]


def added_gradients(a: Spec, b: Spec, value: torch.Tensor, mesh: DeviceMesh) -> tuple[Spec, list[Spec]] | None:
    """DTensor's add of two gradients of ``value`` laid out ``a`` and ``b``, as autograd sums
    them: (the layout of the sum, the layouts it reads them in); None where DTensor cannot say."""
    specs = [_spec(mesh, layout, value) for layout in (a, b)]
    try:
        return _dtensor_runs(torch.ops.aten.add.Tensor, specs)
    except Exception:  # no answer: the planner's own rule stands
        return None


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
    x = node.args[0].meta.get("val")
    if not isinstance(x, torch.Tensor):
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    reduced = {d % x.dim() for d in dims} if dims else set(range(x.dim()))
    mean = tuple(PARTIAL_AVG if is_shard(p) and shard_dim(p) in reduced else p for p in saved)
    if not any(is_partial(p) for p in mean):
        return None
    mean_value = torch.empty([1 if d in reduced else n for d, n in enumerate(x.shape)], dtype=x.dtype, device="meta")
    specs = [_spec(mesh, s, t) for s, t in ((saved, x), (mean, mean_value))]
    op = torch.ops.aten.sub.Tensor
    try:
        _, reads = _dtensor_runs(op, specs)
    except Exception:  # DTensor cannot run it as given: nothing to add
        return None
    return [
        (which, before, read, value.numel() * value.element_size(), tuple(value.shape))
        for which, before, read, value in zip(("input", "mean"), (saved, mean), reads, (x, mean_value))
    ]


def replicated_gradient(decision: Decision, k: int, grad: Spec, mesh: DeviceMesh) -> tuple[Spec, Spec] | None:
    """(the layout DTensor reads it in, the layout it hands it on in) for the gradient of
    input ``k`` of ``decision``'s op, laid out ``grad`` by the planner's rules, where the
    op's backward makes it last with a kernel DTensor runs on whole tensors only: the
    backward of ``linalg_solve_triangular`` masks the matrix's gradient with ``tril``, whose
    rule replicates every input (DTensor's ``linalg_replicate_strategy``), so the gradient
    is gathered and reduced there on every axis (Qwen3-Next's gated delta rule). None
    elsewhere, or where DTensor cannot say."""
    maker = gradient_makers(decision.fx_node).get(k)
    if maker is None or not isinstance(maker.op, torch._ops.OpOverload) or all(p == REPLICATE for p in grad):
        return None
    tensors = [a for a in tree_flatten((maker.args, maker.kwargs))[0] if isinstance(a, torch.Tensor)]
    value = _input_value(decision, k)
    if len(tensors) != 1 or value is None or tensors[0].shape != value.shape:
        return None  # the gradient the rules lay out is not what the kernel reads
    gradient = _spec(mesh, grad, tensors[0])
    args, kwargs = tree_map(lambda a: gradient if a is tensors[0] else a, (maker.args, maker.kwargs))
    try:
        sharding = overrides.propagate_uncached(OpSchema(maker.op, args, kwargs, schema_info=runtime_schema_info(maker.op)))
        out = sharding.output_spec
        made = spec_from_placements(out.placements)
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else (gradient,)
        read = spec_from_placements(wanted[0].placements)
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    if any(p != REPLICATE for p in made):
        return None
    return read, made


def _dtensor_runs(op, specs: list, args: tuple | None = None) -> tuple[Spec, list[Spec]]:
    """(the layout DTensor makes ``op``'s output in, the layouts it reads the tensors
    ``specs`` in) where ``op`` is called on ``args`` (default: ``specs``), as its sharding
    rule says; raises where DTensor cannot run it as given."""
    schema = OpSchema(op, tuple(specs) if args is None else args, {}, schema_info=runtime_schema_info(op))
    sharding = overrides.propagate_uncached(schema)
    wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else specs
    return spec_from_placements(sharding.output_spec.placements), [spec_from_placements(s.placements) for s in wanted]


def _spec(mesh: DeviceMesh, layout: Spec, value: torch.Tensor) -> DTensorSpec:
    """DTensor's spec of a tensor shaped like ``value`` laid out ``layout`` on ``mesh``."""
    return DTensorSpec(mesh, runtime_placements(layout), tensor_meta=tensor_meta(value))


def _input_value(decision: Decision, k: int) -> torch.Tensor | None:
    """The traced value of ``decision``'s tensor input ``k``."""
    node = decision.fx_node
    inputs = [a for a in tree_flatten((node.args, node.kwargs))[0] if is_tensor_input(a)]
    value = inputs[k].meta.get("val") if k < len(inputs) else None
    return value if isinstance(value, torch.Tensor) else None


def _transposed(spec: Spec, dims: int) -> Spec:
    """The layout of a tensor of ``dims`` dims laid out ``spec``, as its transpose of the
    last two dims is laid out (the same the other way)."""
    last = (dims - 2, dims - 1)
    return tuple(shard(2 * dims - 3 - shard_dim(p)) if is_shard(p) and shard_dim(p) in last else p for p in spec)




_followed: dict[tuple, Spec | None] = {}


def gradient_only_backward(node: fx.Node, grad: Spec, mesh: DeviceMesh) -> Spec | None:
    """The layout of the gradient the backward of ``node`` (an op of one tensor) hands its
    input, where that backward reads nothing but its output's gradient, laid out ``grad``,
    and DTensor runs each of its ops on the gradient as it comes: a pad's backward pads the
    gradient back (``constant_pad_nd`` with the pads negated), a cumulative sum's sums it
    reversed (``flip``, ``cumsum``, ``flip``), each keeping a split on a dim it does not
    work along (a Mamba-2 scan's chunk padding and decay sums, their gradients split by
    heads). None where one of those ops moves the gradient, reads anything else (a value
    saved by the forward), or DTensor cannot say."""
    key = (signature(node), grad, tuple(mesh.shape))
    if key not in _followed:
        follow = _FollowLayouts(grad, mesh)
        with overrides.installed():
            gradients = input_gradients(node, follow)
        tensors = [g for g in gradients or () if g is not None]
        layout = follow.layouts.get(id(tensors[0])) if len(tensors) == 1 and not follow.moved else None
        _followed[key] = layout
    return _followed[key]


class _FollowLayouts(TorchDispatchMode):
    """Follows the output gradient's layout through the ops a backward runs, by DTensor's
    propagation; ``moved`` once an op asks for another layout of what it reads, or reads
    a tensor not made from the gradient."""

    def __init__(self, grad: Spec, mesh: DeviceMesh):
        super().__init__()
        self.grad, self.mesh = grad, mesh
        self.layouts: dict[int, Spec] = {}
        self.made: list[torch.Tensor] = []  # held, so that no id is reused while following
        self.moved = False

    def __call__(self, gradients):
        self.made += gradients
        self.layouts.update((id(g), self.grad) for g in gradients)
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.moved:
            self._follow(func, args, kwargs or {}, out)
        return out

    def _follow(self, func, args, kwargs, out) -> None:
        read = []

        def spec_of(arg):
            if not isinstance(arg, torch.Tensor):
                return arg
            layout = self.layouts.get(id(arg))
            if layout is None:
                raise LookupError("a tensor not made from the gradient")
            read.append(layout)
            return _spec(self.mesh, layout, arg)

        try:
            schema_args, schema_kwargs = tree_map(spec_of, (args, kwargs))
            schema = OpSchema(func, schema_args, schema_kwargs, schema_info=runtime_schema_info(func))
            sharding = overrides.propagate_uncached(schema)
        except Exception:  # a saved value read, or no rule: DTensor's answer is not this one
            self.moved = True
            return
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else ()
        if any(spec_from_placements(s.placements) != layout for s, layout in zip(wanted, read)):
            self.moved = True
            return
        specs = sharding.output_spec if isinstance(sharding.output_spec, (tuple, list)) else (sharding.output_spec,)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for tensor, spec in zip(outs, specs):
            if isinstance(tensor, torch.Tensor) and isinstance(spec, DTensorSpec):
                self.layouts[id(tensor)] = spec_from_placements(spec.placements)
                self.made.append(tensor)
