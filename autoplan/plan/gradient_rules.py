"""How one op's backward hands its output's gradient on to its inputs, per mesh axis.

``plan/collectives.py`` follows each gradient back through the traced step; these are the
rules it follows it by, one op at a time, as DTensor runs that op's backward:

- a view, a copy, or an add of values of one shape, hands the gradient on as it is
  (``passes_gradient``); a view maps its layout back (``through_view``), and an expand's
  sum over a split broadcast dim is partial (``broadcast_axes``); a view whose backward
  copies the gradient reduces a partial one (``plan/gradient_strides.py``);
- an op linear in its output's gradient that reads nothing split carries a partial
  gradient on unreduced (``carries_partial``, ``partial_axes``), and a split joins its
  outputs' gradients (``output_gradient``); a product whose gradient came back whole
  hands whole gradients on (``whole_product_gradient``);
- a pointwise op (a dtype cast included, ``_CASTS``), a concatenation, an elementwise
  product made split on another dim and a matrix product whose operands were saved whole
  run their backward on a split gradient split (``plan/split_gradients.py``);
- autograd sums a value's gradient parts in the order they are ready, in the layout
  DTensor's add makes (``summed``);
- a product of two trained values reads its output's gradient twice, once per input's
  gradient, and DTensor moves it for each (``gradient_reads``);
- an averaged-partial operand (``x - mean(x)`` with the mean taken over a split dim): an
  add or subtraction hands its whole operands whole gradients (``averaged_sum_axes``),
  and a product's broadcast operand gets its gradient whole after an all-reduce of the
  full-size product (``averaged_product_axes``), gathered first where it is split along a
  dim the sum reduces (``averaged_product_summed``).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import fx

from autoplan.choices.graph import OP
from autoplan.cost.comm import _moves, splits_a_dim_twice, without_partial
from autoplan.cost.estimate import is_view, output_values
from autoplan.dtensor.strategies import is_pointwise
from autoplan.placements import PARTIAL, PARTIAL_AVG, REPLICATE, is_partial, is_shard, shard_dim
from autoplan.plan.backward_ops import backward_keeps_partial, backward_reads_only_gradient


def views_follow(graph, name: str) -> bool:
    """Whether ``name`` is a view, which DTensor runs on its input as it arrives (no move)."""
    decision = graph.decision(name)
    return decision.kind == OP and is_view(decision)


_PASS_THROUGH = (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor, torch.ops.aten.add_.Tensor, torch.ops.aten.sub_.Tensor)
"""In place too: autograd's AddBackward hands the gradient on alike (GPT-OSS's experts add
their bias in place, ``gate_up + bias[experts]`` as ``add_``)."""
_COPIES = (torch.ops.aten.clone.default,)
"""A copy's backward hands the gradient on as it is: autograd's ``CloneBackward`` runs no
op (a ``.contiguous()`` before attention's batched matmul; DeBERTa-v2's partial gradient
went on through it unreduced)."""


def passes_gradient(graph, name: str) -> bool:
    """Whether ``name``'s backward hands its output's gradient to its inputs as it is,
    running no DTensor op that could move it: a view or a copy of one value, or an add or
    subtraction whose trained operands have its own shape (autograd's AddBackward passes
    the gradient on; the move DTensor made of an input for the forward, below autograd,
    has no backward). A broadcast operand that takes no gradient (a mask, fixed positions)
    changes nothing: Gemma 2's scores plus a mask, made split by key on dp, hand the scores
    the whole gradient the softmax's backward made."""
    decision = graph.decision(name)
    if decision.kind != OP:
        return False
    if is_view(decision):
        return len(list(graph.predecessors(name))) == 1
    node = decision.fx_node
    if node.target in _COPIES:
        return len(list(graph.predecessors(name))) == 1
    if node.target not in _PASS_THROUGH or node.kwargs.get("alpha", 1) != 1:
        return False
    shape = getattr(node.meta.get("val"), "shape", None)
    args = [a for a in node.args if hasattr(a, "meta")]
    # by the input's producer: an output of a split is a getitem, which the graph has no decision of
    producers = {k: u for u, _, k in graph.inputs_of(name)}
    trained = [a for k, a in enumerate(args) if k in producers and graph.decision(producers[k]).requires_grad]
    return len(args) == 2 and bool(trained) and all(getattr(a.meta.get("val"), "shape", None) == shape for a in trained)


def passes_gradient_to(graph, name: str, k: int) -> bool:
    """Whether ``name``'s backward hands its input ``k`` its output's gradient as it is:
    where it passes it on to every input (``passes_gradient``), and for an add or
    subtraction, to an input of its own shape beside a broadcast trained one (XLNet's
    query plus a learned bias per head: AddBackward hands the query the gradient as it
    comes, and sums it over the broadcast dims for the bias only)."""
    if passes_gradient(graph, name):
        return True
    decision = graph.decision(name)
    node = decision.fx_node
    if decision.kind != OP or node.target not in _PASS_THROUGH or node.kwargs.get("alpha", 1) != 1:
        return False
    args = [a for a in node.args if hasattr(a, "meta")]
    shape = getattr(node.meta.get("val"), "shape", None)
    return len(args) == 2 and k < len(args) and getattr(args[k].meta.get("val"), "shape", None) == shape


_aten = torch.ops.aten
_REDUCTIONS = (_aten.sum.dim_IntList, _aten.mean.dim, _aten.sum.default, _aten.mean.default)
_INDEXING = (_aten.index.Tensor, _aten.index_select.default, _aten.gather.default)
"""Rows picked by integer indices: the backward adds the gradient back into those rows."""
_PRODUCTS = (_aten.mul.Tensor, _aten._grouped_mm.default)
"""Linear in each operand: a partial gradient times the other operand, replicated, is partial.
Not ``mm`` or ``bmm`` yet: the one row that seemed to ask for them (Bloom's attention,
whose gradient was reduced before it reached ``v``) was a view's backward copying it
(``plan/gradient_strides.py``), and listing them changes no row of the coverage sample."""
_READ_TWICE = (_aten.mul.Tensor, _aten._grouped_mm.default)
"""Products whose backward reads the output's gradient once per trained operand (``gradient_reads``)."""
_PADS_AND_FILLS = (_aten.constant_pad_nd.default, _aten.masked_fill.Scalar)
"""A pad's backward slices the gradient (a pad by negative widths), a scalar fill's fills it
with zeros where the mask says: DTensor runs either on a partial gradient as partial
(Qwen3-Next's padded chunks and its causal mask of pairwise decays)."""
_SOLVES = (_aten.linalg_solve_triangular.default,)
"""Linear in the right-hand side: DTensor solves a partial one against a replicated matrix
as partial (its rule's ``P, R -> P``), and the matrix's gradient, that partial solution
times the saved output, stays partial up to the ``tril`` that reduces it
(``runtime_choice.replicated_gradient``)."""
_RESAMPLES = (
    _aten.upsample_nearest1d.default, _aten.upsample_nearest2d.default, _aten.upsample_nearest3d.default,
    _aten._upsample_nearest_exact1d.default, _aten._upsample_nearest_exact2d.default,
    _aten._upsample_nearest_exact3d.default, _aten.upsample_linear1d.default, _aten.upsample_bilinear2d.default,
    _aten.upsample_bicubic2d.default, _aten.upsample_trilinear3d.default, _aten._upsample_bilinear2d_aa.default,
    _aten._upsample_bicubic2d_aa.default,
)
"""Interpolations: linear in their input, and DTensor's rule for their backward takes a
partial gradient to a partial one (PVT's position embeddings, resized to the patch grid:
their gradient reaches the parameter partial, whose hook reduce-scatters it)."""
_SPLITS = (_aten.split.Tensor, _aten.split_with_sizes.default, _aten.unbind.int)
"""Several outputs of one input: the backward joins their gradients."""
_WITH_A_SCALAR = (  # DTensor registers these apart from its pointwise list
    _aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor,
    _aten.add.Scalar, _aten.sub.Scalar, _aten.mul.Scalar, _aten.div.Scalar,
)
_CASTS = (_aten._to_copy.default,)
"""A dtype cast (an RMSNorm's upcast to float32 and back, in a bfloat16 model): element by
element, but ruled by DTensor apart from its pointwise list."""


def carries_partial(graph, name: str) -> bool:
    """Whether ``name``'s backward is linear in its output's gradient and reads at most
    what it was given as it was made: a pointwise op or a sum or mean of one tensor (an
    RMSNorm's rsqrt, its eps add, its mean of squares; not one whose backward runs an op
    DTensor reduces a partial gradient for, a ``sigmoid_backward`` or a clamp's ``where``:
    ``plan/backward_ops.py``), rows picked by index (a mixture
    of experts' routed tokens), a pad or a fill of a scalar (``_PADS_AND_FILLS``), an
    interpolation (``_RESAMPLES``), a
    triangular solve (``_SOLVES``), a split (its backward joins its outputs' gradients), a
    concatenation (its backward slices the gradient: a rotary embedding's
    ``cat(-x2, x1)``, Gemma 2's in bf16), an add or subtraction of trained operands (its
    backward sums the gradient over what an operand broadcast: XLNet's bias per head), or
    a product (a gated MLP's ``act(gate) * up``, an experts' grouped matrix product: each
    input's gradient is the output's times the other operands, and DTensor's product of a
    partial and a replicated operand is partial). Its input's gradient is partial where
    the output's is, on every axis where its output was not made split (and, for a
    product, where it read every operand whole: ``partial_axes``): DTensor multiplies or
    expands the partial gradient there and reduces nothing."""
    decision = graph.decision(name)
    if decision.kind != OP:
        return False
    target = decision.fx_node.target
    inputs = graph.inputs_of(name)
    trained = sum(graph.decision(u).requires_grad for u, _, _ in inputs)
    if target in _PRODUCTS and len(inputs) >= 2:
        return trained >= 1
    if target is _aten.cat.default:
        return trained >= 1
    if target in _PASS_THROUGH:
        return trained >= 1
    if target in _SOLVES:
        return trained >= 1
    if trained != 1:
        return False
    if target in _INDEXING or target in _SPLITS:  # an index's other inputs are its integer indices
        return True
    if target in _PADS_AND_FILLS:  # a fill's other input is its mask
        return True
    if target in _RESAMPLES:
        return True
    if len(inputs) != 1:
        return False
    # an elementwise op's backward may run an op DTensor reduces a partial gradient for
    return target in _REDUCTIONS or (is_elementwise(graph, name) and backward_keeps_partial(decision.fx_node))


def averaged_product_axes(graph, name: str, k: int, in_shape: tuple, operands: dict) -> tuple[bool, ...]:
    """Per mesh axis: whether the product ``name`` read another operand averaged-partial
    there (``P(avg)``) while its input ``k``, of shape ``in_shape``, is broadcast against
    the output. DTensor's
    product of a whole gradient and that operand is averaged-partial at the output's full
    size, and the sum over the broadcast dims that makes input ``k``'s gradient cannot
    keep an average partial: it all-reduces the full-size product first, and hands input
    ``k`` a whole gradient (Cohere's layer norm, on a hidden dim split by its embedding:
    ``x - mean(x)`` is averaged-partial on tp, and both the weight's and the ``rsqrt``'s
    gradients are all-reduced at the activation's size). ``operands``: as
    ``partial_axes`` takes them."""
    decision = graph.decision(name)
    node = decision.fx_node
    if decision.kind != OP or node.target is not _aten.mul.Tensor or tuple(in_shape) == tuple(node.meta["val"].shape):
        return ()
    others = operand_layouts(operands, but=k)
    if not others:
        return ()
    return tuple(any(layout[axis] == PARTIAL_AVG for layout in others) for axis in range(len(others[0])))


def averaged_product_summed(node, in_shape: tuple, product: tuple) -> tuple:
    """The layout in which DTensor sums the averaged-partial ``product`` of the product
    ``node`` over the dims its input of shape ``in_shape`` was broadcast along. A sum does
    not take an average partial on (``common_reduction_strategy`` calls it non-linear), so
    it reduces every partial and gathers every split of a summed dim too, and the input's
    gradient is whole there (DeBERTa's layer norm, its batch split on tp: the weight's
    gradient product is gathered by batch on tp before its all-reduce on dp)."""
    summed = broadcast_dims(tuple(in_shape), tuple(node.meta["val"].shape))
    return tuple(REPLICATE if is_partial(p) or (is_shard(p) and shard_dim(p) in summed) else p for p in product)


def averaged_sum_axes(graph, name: str, strategy) -> tuple[bool, ...]:
    """Per mesh axis: whether the add or subtraction ``name`` runs there on whole operands
    and averaged-partial ones only (``x - mean(x)`` with the mean partial: each rank adds
    its share of the mean to the whole ``x``, and the average of the sums is the sum).
    Its whole operands' gradients are whole there: the output's gradient, not a partial
    sum (``splits_work`` would call it split work)."""
    decision = graph.decision(name)
    if decision.kind != OP or decision.fx_node.target not in _PASS_THROUGH:
        return ()
    return tuple(
        any(spec[axis] == PARTIAL_AVG for spec in strategy.inputs)
        and all(spec[axis] in (REPLICATE, PARTIAL_AVG) for spec in strategy.inputs)
        for axis in range(len(strategy.inputs[0]) if strategy.inputs else 0)
    )


_JOINED = (_aten.cat.default, _aten.stack.default)
"""Ops whose backward takes each input's part of the gradient apart, one slice per input."""


def gradient_reads(graph, name: str) -> int:
    """How many ops of ``name``'s backward read its output's gradient, each moving it to
    the layout it needs on its own: for ``a * b`` with both trained, ``grad * b`` and
    ``grad * a`` (also for ``x * x``: autograd does not merge them; an RMSNorm's mean of
    squares reduced its gradient twice on a batch split); for a ``cat`` or ``stack``, one
    per input, whether it needs a gradient or not, but for a legacy empty ``(0,)`` one
    (``cat_tensors_backward``): its backward slices (selects) each input's part of the
    gradient apart, and each slice of a gradient split along the joined dim gathers it
    (Doge's rotary ``cat(-x2, x1)``, with the query's gradient split by head dim; LED pads
    its embeddings to the attention window with a ``cat`` on the sequence dim); for an
    experts' grouped matrix product with both operands trained, ``grad @ w.T`` and
    ``grad.T @ x``, per group (DTensor moves the gradient inside each: the MoE example's
    gate-up projection, made split by columns on tp, gets its gradient split by tokens on
    tp from the chunk's backward and runs two all_to_alls there); one for every other op."""
    decision = graph.decision(name)
    if decision.kind == OP and decision.fx_node.target in _JOINED:
        parts = decision.fx_node.args[0]
        return max(1, sum(tuple(part.meta["val"].shape) != (0,) for part in parts if isinstance(part, fx.Node)))
    if decision.kind != OP or decision.fx_node.target not in _READ_TWICE:
        return 1
    return max(1, sum(graph.decision(u).requires_grad for u, _, _ in graph.inputs_of(name)))


def output_gradient(graph, name: str, grads: dict) -> tuple | None:
    """The gradient ``name``'s backward starts from: its (first) output's, or for a split,
    the join of its outputs', per axis: partial where one is partial and none split (a
    replicated part joins a partial one as partial), the common layout where they agree,
    else replicated."""
    if graph.decision(name).fx_node.target not in _SPLITS:
        return grads.get((name, 0))
    parts = [g for i in range(len(output_values(graph.decision(name)))) if (g := grads.get((name, i))) is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    joined = []
    for axis in zip(*parts):
        if any(is_partial(p) for p in axis) and not any(is_shard(p) for p in axis):
            joined.append(PARTIAL)
        else:
            joined.append(axis[0] if len(set(axis)) == 1 else REPLICATE)
    return tuple(joined)


def whole_product_gradient(graph, name: str, operands: dict, k: int, after: tuple, made: tuple, grad: tuple) -> tuple:
    """Input ``k``'s gradient from the product ``name`` where its output's gradient came back
    whole on an axis where the output was made split (a split's backward joins a split part
    with a whole one, gathered): the gradient times the other operands, saved whole there
    too, is whole, however this input was read (an experts' weight gradient, input rows
    times the whole output gradient). ``operands``: as ``partial_axes`` takes them."""
    if graph.decision(name).fx_node.target not in _PRODUCTS:
        return grad
    others = operand_layouts(operands, but=k)
    return tuple(
        REPLICATE if a == REPLICATE and is_shard(m) and all(o[axis] == REPLICATE for o in others) else g
        for axis, (g, a, m) in enumerate(zip(grad, after, made))
    )


def partial_axes(graph, name: str, operands: dict, made: tuple) -> tuple[bool, ...]:
    """Per mesh axis: whether a partial gradient of ``name``'s output goes through its
    backward unreduced (``carries_partial``). Not where the output was made split, unless
    the backward reads nothing saved (``backward_ops.backward_reads_only_gradient``); for a
    product, not where an operand was read or saved split or partial either (``operands``:
    input index -> (layout autograd saved, layout read); a move DTensor made inside the op
    is not what autograd saved): DTensor's product of a partial gradient and a split
    operand reduces first."""
    if not carries_partial(graph, name):
        return (False,) * len(made)
    node = graph.decision(name).fx_node
    product = node.target in _PRODUCTS
    layouts = operand_layouts(operands)
    # a backward that reads nothing saved carries it whatever the op made (RWKV's ``1 - w``
    # of a weight stored split twice on one dim)
    anywhere = not product and backward_reads_only_gradient(node)
    return tuple(
        (anywhere or not is_shard(m)) and not (product and any(layout[axis] != REPLICATE for layout in layouts))
        for axis, m in enumerate(made)
    )


def operand_layouts(operands: dict, but: int | None = None) -> list[tuple]:
    """Every layout, saved and read, of an op's operands (but input ``but``): ``operands``
    maps an input index to (the layout autograd saved, the layout the op read)."""
    return [layout for i, pair in operands.items() if i != but for layout in pair if layout is not None]


def is_elementwise(graph, name: str) -> bool:
    """Whether ``name`` computes element by element (DTensor's pointwise list, the ops it
    registers with a scalar apart, dtype casts)."""
    decision = graph.decision(name)
    if decision.kind != OP:
        return False
    target = decision.fx_node.target
    return target in _WITH_A_SCALAR or target in _CASTS or is_pointwise(target)


def through_view(decision, after: tuple, dst: tuple) -> tuple:
    """The gradient a view hands its input, given its output's gradient ``after``: split
    where ``after`` is (a slice DTensor took further on stays split back through the view:
    the view strategy making that layout says where), partial where it is partial, else as
    the view read its input (``dst``; replicated where it read it partial: the gradient of
    a partial value is whole, as OLMoE's experts' weighted output, viewed partial on tp
    and reduced after the view, gets it back). An expand's backward sums over the dims it
    broadcast: split there, that sum is partial."""
    split = tuple(REPLICATE if is_partial(g) else g for g in after)
    broadcast = broadcast_axes(decision.fx_node, split)
    if broadcast:
        split = tuple(REPLICATE if axis in broadcast else p for axis, p in enumerate(split))
    dst = tuple(without_partial(dst))
    # the layouts of the input that make ``split``, compared input to input: a transpose
    # reads its heads split as S(2) and makes its rows split as S(2)
    back = [tuple(s.inputs[0]) for s in decision.strategies if len(s.inputs) == 1 and tuple(s.outputs[0]) == split]
    if back and dst not in back:
        dst = tuple(without_partial(back[0]))
    return tuple(PARTIAL if is_partial(g) or axis in broadcast else p for axis, (g, p) in enumerate(zip(after, dst)))


def broadcast_axes(node, split: tuple) -> tuple[int, ...]:
    """Mesh axes on which ``split`` divides a dim that the expand ``node`` broadcast."""
    if node.target is not torch.ops.aten.expand.default:
        return ()
    grown = broadcast_dims(tuple(node.args[0].meta["val"].shape), tuple(node.meta["val"].shape))
    return tuple(axis for axis, p in enumerate(split) if is_shard(p) and shard_dim(p) in grown)


def broadcast_dims(before: tuple, after: tuple) -> set[int]:
    """The dims of ``after`` that broadcasting a tensor of shape ``before`` grows: those it
    lacks, and those of size 1 it has where ``after``'s are larger."""
    lead = len(after) - len(before)
    return {d for d in range(len(after)) if after[d] != 1 and (d < lead or before[d - lead] == 1)}


def summed(parts: list, nbytes: float, mesh_shape, found: Counter, add=None) -> tuple:
    """The layout of autograd's sum of gradients ``[(when ready, layout, module)]``, added
    in the order they become ready (the last reader's first): per axis a common placement
    stays; a replicated gradient added to a partial one makes a partial sum; one added to
    a split one is sliced. A partial gradient added to a split one is reduce-scattered
    first, by DTensor's add, each time (the collectives go into ``found``, charged to the
    module whose backward hands over the part added: autograd adds it as it arrives).
    Two parts split on different dims of one axis cost DTensor the same move either way,
    and ``add(total, part)`` says which it makes: ``(layout made, (layouts read))``, or None
    where DTensor cannot say (DeepSeek V4's hyper-connection mixes get two gradients split
    by one dim on dp and one split by another: DTensor moves the sum once to the parts'
    split, where keeping the first would move each part). So is a sum where a part has a dim
    split over two axes, whose pieces nest as a whole-axis rule cannot tell (MobileBERT's
    tied word embeddings, stored split over dp and tp, get the decoder's gradient so and
    the embedding's partial on tp: DTensor adds them whole)."""
    ordered = sorted(parts, key=lambda part: -part[0])
    total = ordered[0][1]
    for _, part, module in ordered[1:]:
        nested = total != part and (splits_a_dim_twice(total) or splits_a_dim_twice(part))
        asked = add(total, part) if add is not None and (_split_apart(total, part) or nested) else None
        target = tuple(_added(a, b) for a, b in zip(total, part)) if asked is None else asked[0]
        reads = (target, target) if asked is None else asked[1]
        for side, read in zip((total, part), reads):
            for kind, axis, size in _moves(side, read, nbytes, mesh_shape):
                found[(module, kind, axis, round(size))] += 1
        total = target
    return total


def _split_apart(a: tuple, b: tuple) -> bool:
    """Whether on some mesh axis ``a`` and ``b`` are split on different dims."""
    return any(is_shard(x) and is_shard(y) and x != y for x, y in zip(a, b))


def _added(a: str, b: str) -> str:
    """One axis of the layout DTensor adds two gradients in."""
    if a == b:
        return a
    if is_shard(a) or is_shard(b):
        return a if is_shard(a) else b
    return PARTIAL  # replicated and partial
