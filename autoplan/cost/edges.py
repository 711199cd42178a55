"""Stage 3, the edges: what moving a value from its producer's layout to its reader's costs.

Per edge (producer output -> consumer input): ``seconds[row][col]`` for every (distinct
producer output spec, distinct consumer input spec) pair, from ``comm.redistribute_seconds``,
backward included when the value carries a gradient; ``kept_bytes``, the moved copy of a
value the consumer saves (``cost/memory.py``'s ``kept_reads``); ``rerun_seconds``, the move's
forward part a checkpointed reader repeats. A pair DTensor never runs costs ``NOT_RUN_S`` on
top (``_not_run``): on an edge DTensor moves itself (inside a module, ``_moved_by_dtensor``),
where the consumer's strategies of that column must gather the arriving value (``_gathers``)
and another strategy takes it as it arrives (or only slices it), the other inputs as they
were wanted, DTensor's selection, cost-driven op by op, runs that other one. ``estimate.py``
costs the nodes and calls ``edge_cost`` for every edge.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx

from autoplan.choices.decision import Decision
from autoplan.choices.graph import OP
from autoplan.cost.comm import moves_locally, redistribute_seconds
from autoplan.cost.memory import kept_copy
from autoplan.cost.values import output_values, tensor_bytes
from autoplan.dtensor.view_rules import RESHAPING_VIEWS, splits_back
from autoplan.placements import Spec, is_shard, shard_dim, shard_factor


@dataclass(frozen=True, slots=True)
class EdgeCost:
    rows: tuple[Spec, ...]
    """Distinct output specs of the producer (at this output index)."""
    cols: tuple[Spec, ...]
    """Distinct input specs the consumer requires at this input index."""
    row_of: tuple[int, ...]
    """Producer strategy index -> row."""
    col_of: tuple[int, ...]
    """Consumer strategy index -> column."""
    seconds: tuple[tuple[float, ...], ...]
    kept_bytes: tuple[tuple[float, ...], ...] | None = None
    """Per (row, column): the moved copy of a saved value kept until the backward; None: none."""
    forward_bytes: tuple[tuple[float, ...], ...] | None = None
    """Per (row, column): what the move holds at the forward's third peak (``cost/memory.py``):
    the kept copy where the reader runs before the heaviest move, the whole move's
    buffers where it is that move; None: nothing."""
    rerun_seconds: tuple[tuple[float, ...], ...] | None = None
    """Per (row, column): the move's forward part, which a checkpointed reader's rerun
    repeats (``solve/recompute.py``); None: none."""


NOT_RUN_S = 1.0
"""Charged on an edge pair DTensor would not run (``_not_run``): far above any step's cost,
so that the solver takes it only where nothing else fits."""


def _free_inputs(strategies, k: int) -> list[set]:
    """Per strategy j: the specs input ``k`` may take in a strategy that differs from j
    only by free moves of the other inputs (each other input arriving as j wants it)."""
    found = []
    for strategy in strategies:
        others = [m for m in range(len(strategy.inputs)) if m != k]
        found.append({
            alt.inputs[k] for alt in strategies
            if len(alt.inputs) == len(strategy.inputs) and all(moves_locally(strategy.inputs[m], alt.inputs[m]) for m in others)
        })
    return found


def _moved_by_dtensor(choices, u: str, v: str) -> bool:
    """Whether DTensor's op selection moves the value on edge ``u -> v`` (``_not_run``
    applies): an op's output read by an op in the same module or an enclosing one. Where
    the edge enters a module, that module's input hook moves the value (``apply_plan``),
    as it does a parameter to its use layout; DTensor then finds it as planned."""
    graph = choices.graph
    if graph.decision(u).kind != OP or graph.decision(v).kind != OP:
        return False
    owners = choices.traced.node_modules
    made, read = owners.get(u) or "", owners.get(v) or ""
    return made == read or read == "" or made.startswith(read + ".")


def _gathers(src: Spec, dst: Spec) -> bool:
    """Whether moving ``src`` to ``dst`` undoes a split on some axis. Only such a pair is
    priced out: where DTensor skips a gather and computes on the split value instead,
    the op's work is split there, and the gradients of its other inputs come out
    partial (reduced where the plan has no reduction). A partial value left unreduced
    through an op (a view of a matmul's partial output) is reduced at the next boundary
    by the same collective, and its gradient is the same."""
    return any(is_shard(a) and a != b for a, b in zip(src, dst))


def _not_run(src: Spec, members: list[int], frees: list[set]) -> bool:
    """Whether DTensor runs none of the strategies ``members`` (one column) for input ``k``
    arriving as ``src``: every one of them has an alternative that takes ``src`` freely.
    DTensor picks its strategy by the cost of the moves it needs, op by op, so it never
    pays a collective where a strategy needs none; the planner may well have preferred to
    move the value here (it prices each read of a value on its own), but the run would
    not do so, and the prediction would not hold."""
    return bool(members) and all(any(moves_locally(src, spec) for spec in frees[j] if spec is not None) for j in members)


def _unsplittable_back(view: Decision, value, rows, cols, seconds, mesh_shape):
    """``seconds`` with ``NOT_RUN_S`` added where a reader slices the reshaping ``view``'s
    output on a dim whose gradient the view's backward cannot split back evenly
    (``view_rules.splits_back``): DTensor fails there in the backward."""
    viewed = view.fx_node.args[0]
    assert isinstance(viewed, fx.Node), viewed  # a view reads a traced value
    source = tuple(viewed.meta["val"].shape)
    shape = tuple(value.shape)

    def fails(src: Spec, dst: Spec) -> bool:
        ways: dict[int, int] = {}
        for axis, (a, b) in enumerate(zip(src, dst)):
            if (dim := shard_dim(b)) is not None and a != b:
                ways[dim] = ways.get(dim, 1) * mesh_shape[axis]
        return any(not splits_back(shape, source, dim, n) for dim, n in ways.items())

    return tuple(
        tuple(t + NOT_RUN_S if fails(src, dst) else t for dst, t in zip(cols, row))
        for src, row in zip(rows, seconds)
    )


def edge_cost(choices, profile, u, v, k, out_index, mesh_shape, moves: dict, free_inputs: dict, saved: bool = False) -> EdgeCost:
    """``saved``: autograd keeps the value read, so a moved copy of it is kept too."""
    graph = choices.graph
    producer, consumer = graph.decision(u), graph.decision(v)
    value = output_values(producer)[out_index]
    rows: dict[Spec, int] = {}
    row_of = []
    for s in producer.strategies:
        row_of.append(rows.setdefault(s.output(out_index), len(rows)))
    cols: dict[Spec, int] = {}
    col_of = [cols.setdefault(s.inputs[k], len(cols)) for s in consumer.strategies]
    nbytes = tensor_bytes(value)
    backward = producer.requires_grad and consumer.requires_grad

    def move(src, dst, back=backward):
        key = (src, dst, nbytes, back)
        if key not in moves:
            moves[key] = redistribute_seconds(profile, src, dst, nbytes, mesh_shape, back)
        return moves[key]

    seconds = tuple(tuple(move(src, dst) for dst in cols) for src in rows)
    # What a checkpoint's rerun repeats: the moves' forward part (all of it where no gradient comes back).
    forward = tuple(tuple(move(src, dst, False) for dst in cols) for src in rows) if backward else seconds
    if _moved_by_dtensor(choices, u, v) and any(t > 0 for row in seconds for t in row):
        # Repeated layers share one strategy list per op signature (``choices/graph.py``'s cache).
        key = (id(consumer.strategies), k)
        if key not in free_inputs:
            free_inputs[key] = (_free_inputs(consumer.strategies, k), {})
        frees, answers = free_inputs[key]
        col_specs = tuple(cols)
        members = [[j for j, c in enumerate(col_of) if c == col] for col in range(len(cols))]

        def not_run(src: Spec, c: int) -> bool:
            # Answered once per consumer strategy list: the layers that share it ask alike.
            if (src, c) not in answers:
                answers[src, c] = _gathers(src, col_specs[c]) and _not_run(src, members[c], frees)
            return answers[src, c]

        seconds = tuple(
            tuple(t + NOT_RUN_S if t > 0 and not_run(src, c) else t for c, t in enumerate(row))
            for src, row in zip(rows, seconds)
        )
    if backward and producer.kind == OP and producer.fx_node.target in RESHAPING_VIEWS:
        seconds = _unsplittable_back(producer, value, rows, cols, seconds, mesh_shape)
    kept = None
    if saved:
        grid = tuple(tuple(nbytes / shard_factor(dst, mesh_shape) if kept_copy(src, dst) else 0.0 for dst in cols) for src in rows)
        kept = grid if any(b for row in grid for b in row) else None
    rerun = forward if any(t for row in forward for t in row) else None
    return EdgeCost(tuple(rows), tuple(cols), tuple(row_of), tuple(col_of), seconds, kept, None, rerun)
