"""Reshapes stay in the planner's vocabulary: no view makes a ``_StridedShard``.

Flattening dims of which a later one is sharded (attention's ``(batch, heads, ...)`` to
``(batch * heads, ...)`` with the heads split, say) is a view DTensor runs without moving
data, by marking the result ``_StridedShard``. The planner knows Shard, Replicate and
Partial only (``dtensor/strategies.py`` drops every strategy holding another placement), so it
plans such a view on a gathered input, and prices that gather. Left to itself, DTensor
would skip the gather and carry the strided shard on through the ops after it (batched
matmuls, softmax), into collectives the plan never priced at the module's boundary.

``unstrided`` wraps DTensor's rule for a reshaping view (``overrides.py`` installs it): where the rule
would turn a plain Shard into a ``_StridedShard`` on a mesh axis, the input is replicated
on that axis first, as DTensor does for a reshape it cannot express. That is the strategy
the planner has for such an input, so the run does what the plan priced. A tensor that
already holds a ``_StridedShard`` (built by other code) keeps DTensor's own rule.

A strict view (``aten.view``) of a dim split on an axis that does not divide its leading
factor, which DTensor refuses outright, gets the same treatment: its input is replicated
on that axis (``_unflattened_replicated``), as the planner priced it.
"""

from __future__ import annotations

import re
from functools import cache

import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.utils import generate_redistribute_costs
from torch.distributed.tensor.placement_types import _StridedShard

aten = torch.ops.aten
RESHAPING_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)


def unstrided(rule, diverged=lambda: None):
    """DTensor's ``rule`` for a reshaping view, with no strategy that makes a ``_StridedShard``;
    ``diverged()`` is called whenever that changes the rule's answer."""

    def strategy(op_schema: OpSchema) -> OpStrategy:
        try:
            result = rule(op_schema)
        except RuntimeError as err:
            if _UNEVEN_UNFLATTEN not in str(err):
                raise
            diverged()
            return _unflattened_replicated(rule, op_schema, err)
        source = op_schema.args_schema[0]
        if not isinstance(result, OpStrategy) or not isinstance(source, OpStrategy):
            return result
        kept = []
        for op_spec in result.strategies:
            made = _strided_axes(op_spec)
            if not made:
                kept.append(op_spec)
                continue
            diverged()
            kept.extend(_with_axes_replicated(rule, op_schema, source, op_spec, made))
        return OpStrategy(kept)

    return strategy


_UNEVEN_UNFLATTEN = "Cannot unflatten unevenly sharded tensor"
_MESH_AXIS = re.compile(r"mesh dimension (\d+)")


def _unflattened_replicated(rule, op_schema: OpSchema, err: RuntimeError) -> OpStrategy:
    """The rule's strategy for a strict view (``aten.view``: ``unflatten``, ``view`` to more
    dims) of a dim split on a mesh axis that does not divide the view's leading factor:
    the input replicated on that axis first. DTensor refuses such a view ("Cannot
    unflatten unevenly sharded tensor ... Please redistribute the tensor before this
    operation") where a reshape gathers; the planner, which skips a placement a rule
    refuses, plans the view on the gathered input and prices that gather, so the run does
    the same (``nn.MultiheadAttention`` unflattens its packed q/k/v projection, 3 x E
    wide, by 3, which 4 ranks cannot split)."""
    source = op_schema.args_schema[0]
    assert isinstance(source, OpStrategy), source  # the rule only raises on a tensor's placement
    found = []
    for given in source.strategies:
        placements = list(given.output_spec.placements)
        error: RuntimeError | None = err
        while error is not None:
            match = _MESH_AXIS.search(str(error))
            axis = int(match.group(1)) if match else next(
                (i for i, p in enumerate(placements) if not isinstance(p, Replicate)), None
            )
            if axis is None or isinstance(placements[axis], Replicate):
                raise err
            placements[axis] = Replicate()
            replicated = DTensorSpec(given.output_spec.mesh, tuple(placements), tensor_meta=given.output_spec.tensor_meta)
            schema = OpSchema(
                op_schema.op,
                (OpStrategy([OpSpec(replicated)]),) + tuple(op_schema.args_schema[1:]),
                op_schema.kwargs_schema,
                schema_info=op_schema.schema_info,
            )
            try:
                result = unstrided(rule)(schema)
                error = None
            except RuntimeError as again:
                if _UNEVEN_UNFLATTEN not in str(again):
                    raise
                error = again
        for inner in result.strategies:
            costs = [generate_redistribute_costs(source, inner.input_specs[0])]
            found.append(OpSpec(inner.output_specs, inner.input_specs, redistribute_cost=costs))
    return OpStrategy(found)


def _strided_axes(op_spec: OpSpec) -> set[int]:
    """Mesh axes on which the view would turn a plain Shard into a ``_StridedShard``."""
    out = op_spec.output_specs
    if not isinstance(out, DTensorSpec) or not op_spec.input_specs:
        return set()
    given = op_spec.input_specs[0].placements
    return {
        axis for axis, placement in enumerate(out.placements)
        if isinstance(placement, _StridedShard) and not isinstance(given[axis], _StridedShard)
    }


def _with_axes_replicated(rule, op_schema: OpSchema, source: OpStrategy, op_spec: OpSpec, axes: set[int]) -> list[OpSpec]:
    """The rule's strategies for the view's input replicated on ``axes`` (its cost from ``source``)."""
    assert op_spec.input_specs is not None, op_spec  # a view rule's strategies name their input
    given = op_spec.input_specs[0]
    placements = tuple(Replicate() if axis in axes else p for axis, p in enumerate(given.placements))
    replicated = DTensorSpec(given.mesh, placements, tensor_meta=given.tensor_meta)
    schema = OpSchema(
        op_schema.op,
        (OpStrategy([OpSpec(replicated)]),) + tuple(op_schema.args_schema[1:]),
        op_schema.kwargs_schema,
        schema_info=op_schema.schema_info,
    )
    found = []
    for inner in unstrided(rule)(schema).strategies:
        costs = [generate_redistribute_costs(source, inner.input_specs[0])]
        found.append(OpSpec(inner.output_specs, inner.input_specs, redistribute_cost=costs))
    return found


@cache  # pure in its arguments; the repeated layers of a model ask the same questions
def splits_back(view_shape: tuple, source_shape: tuple, dim: int, ways: int) -> bool:
    """Whether a gradient split ``ways`` ways on ``dim`` of a reshaping view's output
    (``view_shape``) can go back through the view's backward, a view to ``source_shape``.

    The forward may merge dims whole and have its output sliced by the reader (a
    grouped-query attention's key heads, repeated by an expand and merged from
    ``(kv_heads, groups)``, then split by heads); the backward must then split the merged
    dim again, and DTensor puts the split on its first factor, which must divide evenly
    ("Cannot unflatten unevenly sharded tensor"). Merges of other dims are not affected.
    Where dims are merged and split again in other sizes (Funnel's pooled attention), the
    split lands on the first factor only if ``dim`` leads the merged dims; a split of a
    later one would need a strided shard, and cannot go back."""
    from torch.distributed.tensor._ops._view_ops import Flatten, InputDim, Split, view_groups

    for rule in view_groups(tuple(view_shape), tuple(source_shape)):
        if not isinstance(rule, Split) or rule.split_id != 0:
            continue
        merged = rule.input_dim.input_dims if isinstance(rule.input_dim, Flatten) else (rule.input_dim,)
        dims = [d.input_dim for d in merged if isinstance(d, InputDim)]
        if dims[:1] == [dim]:
            return rule.group_shape[0] % ways == 0
        if dim in dims:
            return False
    return True
