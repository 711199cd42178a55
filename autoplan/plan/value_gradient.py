"""One value's gradient in the step's backward: its readers' parts, summed where it was
made.

``plan/collectives.py`` walks the graph backwards, value by value, and asks
``value_gradient`` for the layout each value's summed gradient has where the value was
made, counting the collectives on its way there: each reader's part as that reader's
backward hands it on (``gradient_rules.py``, ``split_gradients.py``, and DTensor's own
answers where it is asked: ``runtime_choice.py``, ``runtime_backward.py``), the sum at
each module boundary the value crossed, inner ones first, with the move back to the
layout the value arrived there in, and the sum of what reaches the value. What it reads
of the step, the same for every value, comes in one ``StepBackward``, built once per
step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.choices.graph import ChoiceGraph
from autoplan.cost.comm import (
    gradient_collectives,
    moves_locally,
    redistribute_collectives,
    without_partial,
)
from autoplan.cost.estimate import output_values, splits_work, tensor_bytes
from autoplan.placements import PARTIAL, REPLICATE, is_partial
from autoplan.plan.boundaries import Boundary, through_output_hook
from autoplan.plan.gradient_rules import (
    averaged_product_axes,
    averaged_product_summed,
    averaged_sum_axes,
    output_gradient,
    passes_gradient_to,
    summed,
    through_view,
    views_follow,
    whole_product_gradient,
)
from autoplan.plan.gradient_strides import clone_reduces_partial, copies_gradient
from autoplan.plan.runtime_backward import averaged_product_sum
from autoplan.plan.split_gradients import (
    matmul_input_gradient,
    reshaped_gradient,
    sliced_gradient,
    split_input_gradient,
)


@dataclass(frozen=True, slots=True)
class StepBackward:
    """What ``value_gradient`` reads of the step, the same for every value: the step's
    graph and layouts, and its questions to DTensor as closures of ``step_collectives``,
    which builds it once, so that each value's call passes only what is its own. Its
    dicts are the step's, not copies: ``grads`` fills in as the backward goes, and
    ``found`` counts the collectives."""

    graph: ChoiceGraph
    order: dict[str, int]
    """Node -> its position in the graph (when its gradient part is ready)."""
    grads: dict[tuple[str, int], tuple | None]
    """Value -> its summed gradient's layout, for each value the backward reached."""
    mesh_shape: tuple[int, ...]
    parent_spec: Callable[[Boundary], tuple]
    """A module boundary -> the layout the value arrives at it in."""
    found: Counter
    """Where the collectives go: ``(module, kind, axis index, bytes) -> count``."""
    module_of: Callable[[str], str]
    made: Callable[[str, int], tuple]
    """An op's output -> the layout its gradient meets the op's backward in."""
    exits: set[str]
    """Ops a planned module returns, whose output hook settles their gradient before
    their backward runs (``boundaries.output_nodes``, less the rejoined outputs)."""
    operands: dict[str, dict[int, tuple]]
    """Op -> its inputs' layouts, as saved and as read."""
    join: Callable[[str], tuple | None]
    """A split -> its outputs' gradients joined as DTensor joins them, or None."""
    carries_on: Callable[[str, tuple | None, dict, tuple], tuple[bool, ...]]
    """An op -> the axes its backward carries a partial gradient on, unreduced."""
    backward_product: Callable[[str, int, tuple, dict], tuple | None]
    """An op's input -> its gradient as DTensor runs the op's backward where it is asked
    (``runtime_backward.py``: a matrix product's backward products), or None."""
    whole_gradient: Callable[[str, int, tuple], tuple | None]
    """An op's input -> its gradient where a kernel DTensor runs whole makes it last, or
    None."""
    hook_call: dict[tuple[str, str, int], tuple[str, int]]
    """A read of a parameter a module's hook moves, ``(parameter, reader, input index)``
    -> the hook call it goes through (``parameter_uses.hook_calls``)."""


def value_gradient(
    step: StepBackward, value, readers, chain, rejoined_hook=None, add=None
) -> tuple | None:
    """The layout of ``value``'s summed gradient where it was made (partial where a
    reduction is still due); the collectives on its way back go into ``step.found``.
    ``readers``: its reads the backward reaches; ``chain``: the module boundaries it
    crossed; ``rejoined_hook``: the output hook of a rejoined output
    (``boundaries.rejoined_outputs``), or None; ``add``: DTensor's add of two of its
    gradient's parts (``gradient_rules.summed``), or None."""
    graph, mesh_shape = step.graph, step.mesh_shape
    found, module_of = step.found, step.module_of
    into: dict[object, list] = {}  # attach point -> [(when the part is ready, gradient)]
    moved_by_hook: dict[tuple, list] = {}  # (hook call, attach point, stored layout) -> parts
    nbytes, shape = value_size(graph, value)
    for v, k, strategy, arrived, dst, attach, hooked in readers:  # those the backward reaches
        if passes_gradient_to(graph, v, k):
            after = step.grads.get((v, 0))
            if after is None:
                continue
            # A module's output hook settles the gradient to the planned layout first
            # (gathered and reduced there); the op hands that back to its input.
            # An add's backward hands the gradient on as it is, whatever DTensor moved for
            # its forward (below autograd, so without a backward).
            if v in step.exits:
                grad = without_partial(dst)
            elif views_follow(graph, v):
                out_bytes, out_shape = value_size(graph, (v, 0))
                if any(is_partial(a) for a in after) and copies_gradient(graph, v) and clone_reduces_partial():
                    # the backward's reshape copies the gradient: DTensor's clone reduces it (torch 2.13)
                    whole = without_partial(after)
                    for kind, axis, size in gradient_collectives(after, whole, out_bytes, mesh_shape):
                        found[(module_of(v), kind, axis, round(size))] += 1
                    after = whole
                moved, padded = sliced_gradient(graph.decision(v), reshaped_gradient(graph.decision(v), after), mesh_shape)
                count_move(found, module_of(v), after, moved, out_bytes, out_shape, mesh_shape)
                grad = padded if padded is not None else through_view(graph.decision(v), moved, dst)
            else:
                grad = after
        elif (joined_layout := step.join(v)) is not None:
            grad = joined_layout  # the cat's output is the split input's gradient
        else:
            # read replicated by an op that splits its work: each rank's gradient is a partial
            # sum; read partial: its gradient is the output's, replicated (a partial value's
            # backward only copies the gradient to each rank's share)
            averaged_sum = averaged_sum_axes(graph, v, strategy) or (False,) * len(dst)
            grad = tuple(
                PARTIAL if p == REPLICATE and n > 1 and splits_work(strategy, axis) and not by_average
                else (REPLICATE if is_partial(p) else p)
                for axis, (p, n, by_average) in enumerate(zip(dst, mesh_shape, averaged_sum))
            )
            after = output_gradient(graph, v, step.grads)
            v_made, v_operands = step.made(v, 0), step.operands.get(v, {})
            asked = step.backward_product(v, k, after, v_operands) if after is not None else None
            # (DTensor's answer, where asked, already sums a broadcast operand's product)
            averaged = averaged_product_axes(graph, v, k, shape, v_operands) if asked is None else ()
            if any(averaged):  # the full-size product is made whole before the broadcast sum
                product = tuple(PARTIAL if a else p for a, p in zip(averaged, without_partial(after or v_made)))
                node = graph.decision(v).fx_node
                asked_sum = averaged_product_sum(node, shape, product, mesh_shape)
                summed_in = asked_sum[0] if asked_sum is not None else averaged_product_summed(node, shape, product)
                for kind, axis, size in gradient_collectives(product, summed_in, value_size(graph, (v, 0))[0], mesh_shape):
                    found[(module_of(v), kind, axis, round(size))] += 1
                # the sum's layout where DTensor says (whole, or partial where it summed a split)
                sum_out = asked_sum[1] if asked_sum is not None else summed_in
                grad = tuple(
                    s if s == REPLICATE or (asked_sum is not None and is_partial(s)) else g for s, g in zip(sum_out, grad)
                )
            if asked is not None:
                grad = asked  # DTensor's own backward product, its moves counted
            elif after is not None:
                # a split output gradient runs this pointwise op's backward split (``split_through``)
                grad = split_input_gradient(graph, v, shape, after, v_made, step.exits, grad, mesh_shape, v_operands)
                grad = matmul_input_gradient(graph, v, k, after, v_made, step.exits, v_operands, grad)
                if v not in step.exits:
                    grad = whole_product_gradient(graph, v, v_operands, k, after, v_made, grad)
            if asked is None and after is not None and v not in step.exits:  # an output hook settles it first
                # a partial output gradient goes through this op's backward unreduced where it
                # reads nothing split: DTensor reduces it at the first backward op that does
                through = step.carries_on(v, after, v_operands, v_made)
                grad = tuple(PARTIAL if is_partial(a) and c else g for a, c, g in zip(after, through, grad))
            # the backward's last kernel may run on the gradient whole (``tril``)
            grad = step.whole_gradient(v, k, grad) or grad
        if hooked and arrived != dst and not moves_locally(arrived, dst):
            # a parameter (or a view of one) its module's hook moved above autograd: the
            # move's backward brings the sum of its reads' gradients back to the storage,
            # each call's on its own (ALBERT's one layer, run twice, reduce-scatters its
            # weights' gradients twice)
            call = step.hook_call.get((value[0], v, k), (v, k))
            moved_by_hook.setdefault((call, attach, arrived), []).append((step.order[v], grad, module_of(v)))
            continue
        # Any other input DTensor moved below autograd (gathered, reduced or sliced inside
        # the op): nothing brings the gradient back to the layout it arrived in, so it goes
        # into the sum as the op's backward made it (Gemma 2's softmax, reading scores
        # split by key gathered, hands back a whole gradient)
        into.setdefault(attach, []).append((step.order[v], grad, module_of(v)))
    for (_, attach, arrived), parts in moved_by_hook.items():
        first = min(parts)  # charged to the first read's module, as the step's count tags it
        grad = summed(parts, nbytes, mesh_shape, found, add)
        for kind, axis, size in gradient_collectives(grad, arrived, nbytes, mesh_shape, shape):
            found[(first[2], kind, axis, round(size))] += 1
        into.setdefault(attach, []).append((first[0], without_partial(arrived), first[2]))
    for b in sorted(chain, key=lambda b: -b.depth):  # inner boundaries first
        parts = into.pop(b, [])
        before = step.parent_spec(b)
        if not parts:
            continue
        if before == b.spec:  # the hook moved nothing: one tensor, one sum with the outer readers
            into.setdefault(b.parent, []).extend(parts)
            continue
        grad = summed(parts, nbytes, mesh_shape, found, add)
        for kind, axis, size in gradient_collectives(grad, before, nbytes, mesh_shape, shape):
            found[(b.fqn, kind, axis, round(size))] += 1
        into.setdefault(b.parent, []).append((min(part[0] for part in parts), without_partial(before), b.fqn))
    parts = into.get(None, [])
    if parts and rejoined_hook is not None:
        parts = through_output_hook(parts, rejoined_hook, nbytes, shape, mesh_shape, found, add)
    return summed(parts, nbytes, mesh_shape, found, add) if parts else None


def count_move(found: Counter, module: str, before: tuple, after: tuple, nbytes: float, shape, mesh_shape) -> None:
    """Count in ``found``, charged to ``module``, the collectives of DTensor's forward move
    of a value of ``nbytes`` and ``shape`` from ``before`` to ``after``."""
    for kind, axis, size, _ in redistribute_collectives(before, after, nbytes, mesh_shape, backward=False, shape=shape):
        found[(module, kind, axis, round(size))] += 1


def value_size(graph, value: tuple[str, int]) -> tuple[float, tuple[int, ...]]:
    """The bytes and shape of ``value`` (DTensor plans a move over several axes by its sizes)."""
    tensor = output_values(graph.decision(value[0]))[value[1]]
    return tensor_bytes(tensor), tuple(getattr(tensor, "shape", ()))
