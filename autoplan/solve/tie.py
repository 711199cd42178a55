"""Tie the two traced copies of a repeated layer to one set of decisions, costed N times.

The model was traced with its layer stack cut to layers 0 and 1 (``trace/repeats.py``). Every
decision is in a *region*: 0 (layer 0), 1 (layer 1) or None (before and after the stack).
The full model's step cost, when all N layers take the same strategies x, is

    outside + C_0(x) + E_in(0) + (N-1) * (C_1(x) + E_in(1))

where C_r is region r's node costs and E_in(r) the costs of the edges into region r:
layer 1 reads layer 0's output and the values computed before the stack, exactly as each
of layers 1..N-1 reads its predecessor's. So region 1's node costs and in-edges are
weighted N-1 (``weights``), and each decision of layer 1 is replaced by its twin in
layer 0 (``tie_costs``): node costs add up, edges are re-keyed to the twins (summed where
two land on one key), and an edge whose two ends become one decision (a value read by
its own twin) becomes a cost on that decision's strategies (the matrix diagonal).

The result is the untied problem restricted to plans in which every layer is laid out
alike. Its optimum is an upper bound on the untied optimum; ``benchmarks/scale.py``
measures the difference on an 8-layer model.

``match_blocks`` checks the premise: the two copies are the same graph (same ops, shapes,
strategies, in the same order), layer 0 reads only itself and the outside, layer 1 reads
only itself, layer 0's matching value, or the same outside value, and nothing outside
reads layer 0. Anything else returns None and the caller traces the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.choices.decision import Decision
from autoplan.choices.graph import BUFFER, PARAMETER, ChoiceGraph
from autoplan.cost.edges import EdgeCost
from autoplan.cost.estimate import RECOMPUTE_ROWS, CostedGraph, NodeCost, forward_row, recompute_rows
from autoplan.recompute_policy import selective_keeps
from autoplan.solve.simplify import Simplified, merge_followers
from autoplan.trace.repeats import RepeatedBlocks

MAX_MERGE_ROUNDS = 4


@dataclass(frozen=True)
class Tied:
    costed: CostedGraph
    """The tied problem the solver sees (layer-1 decisions folded into their twins)."""
    twins: dict[str, str]
    """Layer-1 leader -> its layer-0 twin."""
    simplified: Simplified
    """The untied simplified problem (its followers expand the solution)."""


def block_regions(choices: ChoiceGraph, blocks: RepeatedBlocks) -> dict[str, int | None]:
    """Decision -> 0 or 1 (the traced layer it belongs to), None outside the stack."""
    traced = choices.traced
    regions: dict[str, int | None] = {}
    for decision in choices.graph.decisions():
        name = decision.name
        if decision.kind == PARAMETER:
            layers = {blocks.layer_of(fqn) for fqn in traced.parameters[name]}
            regions[name] = layers.pop() if len(layers) == 1 else None
        elif decision.kind == BUFFER:
            regions[name] = blocks.layer_of(traced.buffers[name])
        else:
            regions[name] = blocks.layer_of(decision.module)
    return regions


def match_blocks(choices: ChoiceGraph, regions: dict[str, int | None]) -> dict[str, str] | None:
    """Layer-1 decision -> its layer-0 twin, or None when the copies do not match."""
    graph = choices.graph
    first = [n for n in graph.nodes if regions[n] == 0]
    second = [n for n in graph.nodes if regions[n] == 1]
    if not first or len(first) != len(second) or any(r not in (None, 0, 1) for r in regions.values()):
        return None
    twin = dict(zip(second, first))
    for b, a in twin.items():
        da, db = graph.decision(a), graph.decision(b)
        if da.kind != db.kind or da.strategies != db.strategies or not _same_value(da, db):
            return None
        ins_a, ins_b = graph.inputs_of(a), graph.inputs_of(b)
        if [(i, k) for _, i, k in ins_a] != [(i, k) for _, i, k in ins_b]:
            return None
        for (pa, _, _), (pb, _, _) in zip(ins_a, ins_b):
            if regions[pa] == 0 and twin.get(pb) == pa:
                continue  # inside the layer
            if regions[pa] is None and (pb == pa or regions[pb] == 0):
                continue  # a value from before the stack, or the previous layer's output
            return None
    for u, v in graph.edges():
        if regions[u] == 0 and regions[v] is None:
            return None  # something after the stack reads layer 0: not a plain chain of layers
    return twin


def weights(regions: dict[str, int | None], count: int):
    """(node weight, edge weight by consumer, reads for gradient reducers) for ``count`` layers."""
    def node(name: str) -> int:
        return count - 1 if regions[name] == 1 else 1

    def reads(producer: str, consumer: str) -> int:
        # A value from before the stack is read by every layer; layer values by their successor only.
        return node(consumer) if regions[producer] is None else 1

    return node, reads


def simplify_alike(costed: CostedGraph, regions, twins: dict[str, str]) -> Simplified:
    """Merge followers so that both copies merge the same way (else keep the odd ones apart).

    A follower's best response can differ between the copies when their costs differ (a
    gradient reduction shared with a different number of readers); such pairs stay
    unmerged. If that does not settle, nothing inside the layers is merged.
    """
    keep: set[str] = set()
    for _ in range(MAX_MERGE_ROUNDS):
        simplified = merge_followers(costed, regions, frozenset(keep))
        odd = _unlike_merges(simplified, twins)
        if not odd:
            return simplified
        keep |= odd
    return merge_followers(costed, regions, frozenset(n for n, r in regions.items() if r is not None))


def _unlike_merges(simplified: Simplified, twins: dict[str, str]) -> set[str]:
    followers = simplified.followers
    odd = set()
    for b, a in twins.items():
        fa, fb = followers.get(a), followers.get(b)
        if fa is None and fb is None:
            continue
        if fa is None or fb is None or twins.get(fb[0]) != fa[0] or fa[1] != fb[1]:
            odd |= {a, b}
    return odd


def tie_costs(simplified: Simplified, twins: dict[str, str], node_weight) -> Tied:
    """Fold each layer-1 leader into its layer-0 twin (see the module docstring)."""
    costed = simplified.costed
    graph = costed.choices.graph
    keeps = selective_keeps()
    twin_of = {b: a for b, a in twins.items() if b in costed.nodes}

    def target(name: str) -> str:
        return twin_of.get(name, name)

    sums: dict[str, list[list[float]]] = {}
    kinds: dict[str, str] = {}
    for name, cost in costed.nodes.items():
        w = node_weight(name)
        total = sums.setdefault(target(name), [[0.0] * len(cost.compute_s) for _ in range(5 + len(RECOMPUTE_ROWS))])
        columns = (cost.compute_s, cost.comm_s, cost.memory_bytes, cost.end_bytes, *recompute_rows(cost), forward_row(cost))
        for column, values in zip(total, columns):
            for i, value in enumerate(values):
                column[i] += w * value
        kinds.setdefault(target(name), cost.memory_kind)

    edges: dict[tuple[str, str, int], EdgeCost] = {}
    for (u, v, k), edge in costed.edges.items():
        w = node_weight(v)
        tu, tv = target(u), target(v)
        scaled = tuple(tuple(w * t for t in row) for row in edge.seconds)
        kept = _scaled(edge.kept_bytes, w)
        forward = _scaled(edge.forward_bytes, w)
        rerun = _scaled(edge.rerun_seconds, w)
        if tu == tv:  # a value read by its own twin: both ends take the same strategy
            comm, memory, held = sums[tu][1], sums[tu][2], sums[tu][-1]
            reruns = [sums[tu][4 + RECOMPUTE_ROWS.index(row)] for row in ("full_rerun_s", "selective_rerun_s")]
            selective = graph.decision(v).fx_node.target not in keeps  # "selective" hands kept outputs back
            for i in range(len(comm)):
                comm[i] += scaled[edge.row_of[i]][edge.col_of[i]]
                memory[i] += kept[edge.row_of[i]][edge.col_of[i]] if kept else 0.0
                held[i] += forward[edge.row_of[i]][edge.col_of[i]] if forward else 0.0
                if rerun:
                    reruns[0][i] += rerun[edge.row_of[i]][edge.col_of[i]]
                    reruns[1][i] += rerun[edge.row_of[i]][edge.col_of[i]] if selective else 0.0
            continue
        key = (tu, tv, k)
        if key in edges:
            old = edges[key]
            assert (old.rows, old.cols, old.row_of, old.col_of) == (edge.rows, edge.cols, edge.row_of, edge.col_of)
            scaled = tuple(tuple(a + b for a, b in zip(ra, rb)) for ra, rb in zip(old.seconds, scaled))
            kept = _added(old.kept_bytes, kept)
            forward = _added(old.forward_bytes, forward)
            rerun = _added(old.rerun_seconds, rerun)
        edges[key] = EdgeCost(edge.rows, edge.cols, edge.row_of, edge.col_of, scaled, kept, forward, rerun)

    nodes = {
        name: NodeCost(tuple(c), tuple(m), tuple(b), kinds[name], tuple(e), tuple(tuple(row) for row in rest), tuple(f))
        for name, (c, m, b, e, *rest, f) in sums.items()
    }
    tied = CostedGraph(costed.choices, costed.profile, nodes, edges, costed.regime)
    return Tied(tied, twin_of, simplified)


def scale_costs(costed: CostedGraph, node_weight) -> CostedGraph:
    """The traced graph's costs weighted to the full model (what predictions are made from)."""
    nodes = {}
    for name, c in costed.nodes.items():
        w = node_weight(name)
        nodes[name] = NodeCost(
            tuple(w * x for x in c.compute_s), tuple(w * x for x in c.comm_s), tuple(w * x for x in c.memory_bytes), c.memory_kind,
            tuple(w * x for x in c.end_bytes), tuple(tuple(w * x for x in row) for row in c.recompute),
            tuple(w * x for x in c.forward_bytes), tuple(tuple(w * x for x in row) for row in c.compute_parts),
        )
    edges = {}
    for key, e in costed.edges.items():
        w = node_weight(key[1])
        edges[key] = EdgeCost(e.rows, e.cols, e.row_of, e.col_of, tuple(tuple(w * t for t in row) for row in e.seconds),
                              _scaled(e.kept_bytes, w), _scaled(e.forward_bytes, w), _scaled(e.rerun_seconds, w))
    return CostedGraph(costed.choices, costed.profile, nodes, edges, costed.regime)


def _scaled(grid, w: float):
    """An edge's grid (``EdgeCost.kept_bytes``, ``forward_bytes``, ``rerun_seconds``) times ``w``;
    None stays None."""
    return tuple(tuple(w * b for b in row) for row in grid) if grid else None


def _added(old, new):
    """Two grids of one edge's shape summed; None is zeros."""
    if not old:
        return new
    return tuple(tuple(a + b for a, b in zip(ra, rb)) for ra, rb in zip(old, new or _zeros(old)))


def _zeros(grid):
    return tuple(tuple(0.0 for _ in row) for row in grid)


def _same_value(da: Decision, db: Decision) -> bool:
    fa, fb = da.fx_node, db.fx_node
    if fa.op != fb.op or (fa.op != "placeholder" and fa.target != fb.target):
        return False
    va, vb = fa.meta.get("val"), fb.meta.get("val")
    def shape(v):
        return (tuple(v.shape), v.dtype) if hasattr(v, "shape") else repr(type(v))
    if isinstance(va, (tuple, list)) and isinstance(vb, (tuple, list)):
        return len(va) == len(vb) and all(shape(x) == shape(y) for x, y in zip(va, vb))
    return shape(va) == shape(vb)
