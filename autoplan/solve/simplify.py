"""Shrink the ILP before solving: merge "follower" decisions into the decision they follow.

A decision with a single tensor input (views, casts, unary elementwise ops, norms'
reductions) is merged into its producer's leader: for each strategy ``i`` of the leader,
the follower takes its cheapest strategy that consumes the spec the leader's strategy
``i`` hands it as it is (ties to the lowest index); only when none does, the cheapest
with resharding from that spec. Its costs and memory are added to the leader's strategy
``i``; edges leaving it leave the leader instead, their rows re-derived per leader
strategy. Chains merge transitively.

Why "as it is" first: a follower's choice is fixed before its consumers are seen. The
cheapest response to a replicated input is often a free local slice (the op then runs
on a quarter of the data), but every consumer that wants the whole tensor pays an
all-gather for it. Tiny Llama's rotary cos/sin were sliced on two axes this way: 30 us
of gathers per consumer to save 1 ns, and a layout that sent DTensor's run-time
propagation on a 2x2x2 mesh into its exhaustive redistribute planner. Keeping the
layout is what the follower's consumers can always accept at the producer's price.

``regions`` (node -> region key) keeps merges inside one region: a follower is merged only
into a leader of its own region. Tying (``solve/tie.py``) needs this so that the two traced
copies of a repeated layer simplify alike, each into leaders of its own copy. ``keep``
lists decisions never to merge.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.edges import EdgeCost
from autoplan.cost.estimate import RECOMPUTE_ROWS, CostedGraph, NodeCost, forward_row, recompute_rows
from autoplan.recompute_policy import selective_keeps


@dataclass(frozen=True)
class Simplified:
    costed: CostedGraph
    """The reduced problem: leaders only."""
    followers: dict[str, tuple[str, tuple[int, ...]]]
    """Merged decision -> (leader, its strategy index for each leader strategy)."""

    def expand(self, choice: dict[str, int]) -> dict[str, int]:
        full = dict(choice)
        for name, (leader, pick) in self.followers.items():
            full[name] = pick[choice[leader]]
        return full

    def output_under_leader(self, node: str, out_index: int, leader_strategy: int):
        """The layout ``node`` outputs at ``out_index`` when its leader runs ``leader_strategy``."""
        return output_under_leader(self.costed.choices.graph, self.followers, node, out_index, leader_strategy)


def output_under_leader(graph, followers: dict, node: str, out_index: int, leader_strategy: int):
    own = followers[node][1][leader_strategy] if node in followers else leader_strategy
    return graph.decision(node).strategies[own].output(out_index)


def merge_followers(costed: CostedGraph, regions: dict | None = None, keep=frozenset()) -> Simplified:
    regions = regions or {}
    graph = costed.choices.graph
    followers: dict[str, tuple[str, tuple[int, ...]]] = {}
    keeps = selective_keeps()
    totals = {
        name: [list(c.compute_s), list(c.comm_s), list(c.memory_bytes), list(c.end_bytes or (0.0,) * len(c.compute_s))]
        + [list(row) for row in recompute_rows(c)] + [list(forward_row(c))]
        for name, c in costed.nodes.items()
    }

    for name in graph.nodes:  # graph order: producers first
        inputs = graph.inputs_of(name)
        if len(inputs) != 1 or len(graph.decision(name).strategies) == 1:
            continue
        [(u, out_index, k)] = inputs
        leader = followers[u][0] if u in followers else u
        if len(graph.decision(leader).strategies) == 1 or name in keep:
            continue
        if regions.get(name) != regions.get(leader):
            continue
        edge = costed.edges[(u, name, k)]
        cost = costed.nodes[name]
        own = [c + m for c, m in zip(cost.compute_s, cost.comm_s)]
        rerun_by_selective = graph.decision(name).fx_node.target not in keeps  # "selective" hands kept outputs back
        pick = []
        for i in range(len(graph.decision(leader).strategies)):
            handed = output_under_leader(graph, followers, u, out_index, i)
            row = edge.rows.index(handed)
            as_is = [j for j in range(len(own)) if edge.cols[edge.col_of[j]] == handed]
            best = min(as_is or range(len(own)), key=lambda j: (own[j] + edge.seconds[row][edge.col_of[j]], j))
            pick.append(best)
            totals[leader][0][i] += cost.compute_s[best]
            totals[leader][1][i] += cost.comm_s[best] + edge.seconds[row][edge.col_of[best]]
            totals[leader][2][i] += cost.memory_bytes[best] + (edge.kept_bytes[row][edge.col_of[best]] if edge.kept_bytes else 0.0)
            totals[leader][3][i] += cost.end_bytes[best] if cost.end_bytes else 0.0
            totals[leader][-1][i] += forward_row(cost)[best] + (
                edge.forward_bytes[row][edge.col_of[best]] if edge.forward_bytes else 0.0)
            for recompute_row, values in enumerate(recompute_rows(cost)):
                totals[leader][4 + recompute_row][i] += values[best]
            if edge.rerun_seconds:  # the follower's read, repeated by a rerun as its forward is
                moved = edge.rerun_seconds[row][edge.col_of[best]]
                totals[leader][4 + RECOMPUTE_ROWS.index("full_rerun_s")][i] += moved
                if rerun_by_selective:
                    totals[leader][4 + RECOMPUTE_ROWS.index("selective_rerun_s")][i] += moved
        followers[name] = (leader, tuple(pick))

    nodes = {
        name: NodeCost(tuple(t[0]), tuple(t[1]), tuple(t[2]), costed.nodes[name].memory_kind, tuple(t[3]),
                       tuple(tuple(row) for row in t[4:-1]), tuple(t[-1]))
        for name, t in totals.items()
        if name not in followers
    }
    edges = {}
    for (u, v, k), edge in costed.edges.items():
        if v in followers:
            continue  # absorbed into the leader's cost above
        if u not in followers:
            edges[(u, v, k)] = edge
            continue
        leader = followers[u][0]
        out_index = graph.out_index(u, v, k)
        rows: dict = {}
        row_of = tuple(
            rows.setdefault(output_under_leader(graph, followers, u, out_index, i), len(rows))
            for i in range(len(graph.decision(leader).strategies))
        )
        specs = tuple(rows)
        seconds = tuple(edge.seconds[edge.rows.index(spec)] for spec in specs)
        kept = tuple(edge.kept_bytes[edge.rows.index(spec)] for spec in specs) if edge.kept_bytes else None
        forward, rerun = (
            tuple(grid[edge.rows.index(spec)] for spec in specs) if grid else None for grid in (edge.forward_bytes, edge.rerun_seconds)
        )
        edges[(leader, v, k)] = EdgeCost(specs, edge.cols, row_of, edge.col_of, seconds, kept, forward, rerun)
    reduced = CostedGraph(costed.choices, costed.profile, nodes, edges, costed.regime)
    return Simplified(reduced, followers)


def layer_regions(choices) -> dict[str, str | None] | None:
    """Decision -> the numbered layer it lives in (``model.layers.3``), for ``regions``.

    Keeping merges inside each layer of a stack of three or more is what tied planning
    does (``solve/tie.py``); untied planning and scoring do the same so that all three solve the
    same problem. It also keeps a value read by every layer (rotary tables) from being
    fixed by one greedy best response for all of them. None when the model has no such stack.
    """
    traced = choices.traced
    sizes: dict[str, int] = {}
    for fqn in traced.module_types:
        prefix = _numbered_prefix(fqn)
        if prefix is not None and prefix == fqn:
            stack = prefix.rpartition(".")[0]
            sizes[stack] = sizes.get(stack, 0) + 1
    if not any(n >= 3 for n in sizes.values()):
        return None
    regions: dict[str, str | None] = {}
    for decision in choices.graph.decisions():
        name = decision.name
        if name in traced.parameters:
            fqn = traced.parameters[name][0]
        elif name in traced.buffers:
            fqn = traced.buffers[name]
        else:
            fqn = decision.module
        regions[name] = _numbered_prefix(fqn)
    return regions


def _numbered_prefix(fqn: str) -> str | None:
    parts = fqn.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None
