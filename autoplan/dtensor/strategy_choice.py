"""DTensor's choice of an op strategy, kept from splitting values on axes the plan leaves them whole.

When no strategy of an op takes its inputs as they arrive, DTensor runs the one whose
input redistributions cost least, judged op by op. Chunking a replicated input on
another mesh axis is free and makes the collective that remains smaller, so DTensor
prefers it: ``x (S(0), R) + pos (S(1), R)`` on a dp x tp mesh runs as ``(S(0), S(2))``,
all-gathering ``pos`` on dp a quarter the size, and the output, now split on tp, is
all-gathered back on tp by the next op or module boundary that wants it whole (and its
gradient comes back split on tp as well). The planner priced that path too, found it
dearer over the whole step, and chose the strategy that leaves tp alone.

The same holds for a partial input: ``mean(x) + eps`` with the mean partial on dp is
cheapest, op by op, as a reduce-scatter to a split DTensor then gathers again for the
next op; the plan reduces it with one all-reduce.

``selection`` wraps DTensor's selection (``overrides.py`` installs it): where the strategy it picks has
to move an input anyway (its cost is positive) and splits an input on an axis where
every input arrives unsplit (replicated or partial), the cheapest strategy that splits
no such input runs instead, if there is one. A split that lines an input up with another one that arrives
split on that axis (a query sliced by heads to meet keys split by heads) is the op's
own, and stays. Strategies that move nothing, or only chunk (cost zero), are DTensor's
choice as before.

Nor does DTensor run a strategy that splits a tensor's dim unevenly (a dim its axes do not
divide) where one that splits evenly exists: the planner offers even splits only
(``placements.candidate_specs``), so an uneven one is never what the plan priced, and
DTensor cannot flatten it later ("Cannot flatten unevenly sharded tensor"). A batch of 6
examples, its hidden dim split on tp (4), met a whole index in a ``gather``; DTensor split
both by example on tp, to 2, 2, 2 and 0, and the backward's flatten of that gradient failed
(Inkling's looped decoder at a 6 x 15 batch on 2x4).
"""

from __future__ import annotations

from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy


def _cost(spec: OpSpec) -> float:
    assert spec.redistribute_cost is not None, spec  # DTensor's strategy functions fill it
    return sum(sum(costs) for costs in spec.redistribute_cost)


def _splits_replicated(spec: OpSpec, op_schema: OpSchema) -> bool:
    """Whether ``spec`` shards an input on an axis where every input arrives unsplit
    (replicated or partial).

    Only such a split is DTensor's own: where some input already arrives split on that
    axis (attention's keys split by heads, the query whole), slicing another to match
    is what the op needs there, and what the plan asks for."""
    if spec.input_specs is None:
        return False
    arrivals = list(op_schema.args_spec)
    for axis in range(len(arrivals[0].placements) if arrivals else 0):
        if any(arrived.placements[axis].is_shard() for arrived in arrivals):
            continue
        for arrived, wanted in zip(arrivals, spec.input_specs):
            if not arrived.placements[axis].is_shard() and wanted.placements[axis].is_shard():
                return True
    return False


def _splits_unevenly(spec: OpSpec) -> bool:
    """Whether ``spec`` splits a dim of one of its tensors over axes whose sizes' product
    does not divide it (inputs, and outputs whose shape DTensor already knows)."""
    outputs = spec.output_specs if isinstance(spec.output_specs, tuple) else (spec.output_specs,)
    for tensor in (*(spec.input_specs or ()), *outputs):
        meta = None if tensor is None else tensor.tensor_meta
        if tensor is None or meta is None:
            continue
        ways: dict[int, int] = {}
        for axis, placement in enumerate(tensor.placements):
            dim = getattr(placement, "dim", None)  # Shard's and _StridedShard's
            if placement.is_shard() and isinstance(dim, int):
                ways[dim] = ways.get(dim, 1) * tensor.mesh.shape[axis]
        if any(meta.shape[dim] % n for dim, n in ways.items()):
            return True
    return False


def selection(dtensor_choice, diverged=lambda: None):
    """DTensor's selection ``dtensor_choice``, kept from splitting a dim unevenly and from
    splitting replicated axes; ``diverged()`` is called whenever that changes DTensor's choice."""

    def select(strategy: OpStrategy, op_schema: OpSchema | None = None) -> OpSpec:
        chosen = dtensor_choice(strategy, op_schema)
        try:
            if _splits_unevenly(chosen):
                even = [s for s in strategy.strategies if not _splits_unevenly(s) and _cost(s) < float("inf")]
                if even:
                    diverged()
                    chosen = min(even, key=_cost)
        except TypeError:  # symbolic sizes or costs: leave the choice to DTensor
            return chosen
        if op_schema is None or not _splits_replicated(chosen, op_schema):
            return chosen
        try:
            cost = _cost(chosen)
            if not cost > 0:
                return chosen
            whole = [s for s in strategy.strategies
                     if not _splits_replicated(s, op_schema) and not _splits_unevenly(s) and _cost(s) < float("inf")]
        except TypeError:  # symbolic costs: leave the choice to DTensor
            return chosen
        if not whole:
            return chosen
        diverged()
        return min(whole, key=_cost)

    return select
