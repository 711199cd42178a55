"""A feasible plan to start the solver from, found greedily in one pass.

With a time limit, the solver must always have a plan to return; HiGHS starts from
this one (a MIP start) and reports its gap against it. It is FSDP taken to every mesh
axis: each parameter and batch input takes its leanest placement (the most sharded one),
then, in graph order, each op takes the strategy that is cheapest given the placements
its already-placed producers chose. If that plan does not fit the memory budget,
every decision takes its leanest strategy instead: that assignment needs the least
memory any plan can, so it fits whenever any plan does.
"""

from __future__ import annotations

from autoplan.cost.estimate import CostedGraph


def greedy_start(costed: CostedGraph, budget_bytes: float, allowed: dict[str, set[int]] | None = None) -> dict[str, int]:
    allowed = allowed or {}
    inputs: dict[str, list] = {}
    for (u, v, _k), edge in costed.edges.items():
        inputs.setdefault(v, []).append((u, edge))
    choice: dict[str, int] = {}
    for name, cost in costed.nodes.items():
        options = sorted(allowed.get(name, range(len(cost.compute_s))))
        ins = inputs.get(name, [])
        if not ins:  # a placeholder (or a decision read from nothing placed yet): leanest first
            choice[name] = min(options, key=lambda i: (cost.memory_bytes[i], cost.compute_s[i] + cost.comm_s[i], i))
            continue

        def seconds(i: int) -> float:
            total = cost.compute_s[i] + cost.comm_s[i]  # noqa: B023 - called in this iteration
            for u, edge in ins:  # noqa: B023 - called in this iteration
                if u in choice:
                    total += edge.seconds[edge.row_of[choice[u]]][edge.col_of[i]]
            return total

        choice[name] = min(options, key=lambda i: (seconds(i), i))
    if peak_bytes(costed, choice) > budget_bytes:
        choice = leanest(costed, allowed)
    return choice


def peak_bytes(costed: CostedGraph, choice: dict[str, int]) -> float:
    """One assignment's peak: the largest of its memory rows (``cost/memory.py``)."""
    end = sum(costed.nodes[n].end_bytes[i] for n, i in choice.items() if costed.nodes[n].end_bytes)
    return max(start_bytes(costed, choice), end, forward_bytes(costed, choice))


def forward_bytes(costed: CostedGraph, choice: dict[str, int]) -> float:
    """One assignment's memory row at the forward's heaviest move (nothing checkpointed)."""
    held = sum(costed.nodes[n].forward_bytes[i] for n, i in choice.items() if costed.nodes[n].forward_bytes)
    return held + sum(
        edge.forward_bytes[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
        for (u, v, _), edge in costed.edges.items() if edge.forward_bytes
    )


def start_bytes(costed: CostedGraph, choice: dict[str, int]) -> float:
    """One assignment's memory row where the backward starts (nothing checkpointed)."""
    start = sum(costed.nodes[n].memory_bytes[i] for n, i in choice.items())
    return start + sum(
        edge.kept_bytes[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
        for (u, v, _), edge in costed.edges.items() if edge.kept_bytes
    )


def leanest(costed: CostedGraph, allowed: dict[str, set[int]]) -> dict[str, int]:
    """Every decision at its least-memory strategy (ties: the faster, then the lower index)."""
    choice = {}
    for name, cost in costed.nodes.items():
        options = sorted(allowed.get(name, range(len(cost.compute_s))))
        choice[name] = min(options, key=lambda i: (cost.memory_bytes[i], cost.compute_s[i] + cost.comm_s[i], i))
    return choice
