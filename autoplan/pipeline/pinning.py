"""Solving for a given layout: the planning problem with some decisions pinned.

Scoring a plan and building baseline plans both ask the same question: "what is the
cheapest execution of this layout?" A layout fixes some values' placements (parameters,
batch inputs, the tensors crossing module boundaries) and leaves the rest to the solver.

A pin is a predicate on one decision's strategy. The solver works on the simplified
problem, where a merged follower has no variable of its own, so a pin on a follower
becomes a pin on its leader: the leader strategies ``i`` whose best response
``pick[i]`` satisfies the predicate (``solve/simplify.py``). Pins intersect; a pin that would
leave a decision no strategy is reported as a conflict, never silently dropped.

    problem = prepare_problem(model, batch, (2, 4), ("dp", "tp"), "cpu-gloo")
    pins = Pins(problem)
    pins.value("p_0", 0, ("R", "S(0)"))           # a parameter / batch placeholder
    plan, solution = solve_pinned(problem, pins)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

from torch import nn

from autoplan.choices.graph import OP, ChoiceGraph, build_choices
from autoplan.cost.estimate import CostedGraph, estimate_costs
from autoplan.errors import InfeasibleError, PlanError
from autoplan.placements import Spec, format_spec
from autoplan.plan.module_plan import Plan
from autoplan.plan.builder import build_plan
from autoplan.cost.profile import ClusterProfile
from autoplan.solve.simplify import Simplified, layer_regions, merge_followers
from autoplan.solve.ilp import Solution, solve
from autoplan.dtensor.strategies import Strategy
from autoplan.pipeline.suggest import resolve_options
from autoplan.trace.tracer import TracedGraph, trace_model
from autoplan.plan.views import spec_after_views, view_chain

GIB = 2**30


@dataclass(frozen=True)
class Problem:
    """One model traced, its choices costed and simplified, for one mesh and profile."""

    traced: TracedGraph
    choices: ChoiceGraph
    costed: CostedGraph
    """Full costs (followers included): what predictions are computed from."""
    simplified: Simplified
    """Leaders only: what the solver sees."""
    budget_bytes: float
    """Per-device memory budget."""

    @property
    def profile(self) -> ClusterProfile:
        return self.costed.profile

    def node_of(self, name: str) -> str | None:
        """Placeholder node of a parameter FQN (any tied alias) or a batch key path."""
        for node, fqns in self.traced.parameters.items():
            if name in fqns:
                return node
        for node, key in self.traced.inputs.items():
            if key == name:
                return node
        return None


def prepare_problem(
    model: nn.Module,
    example_inputs,
    mesh: tuple[int, ...],
    axis_names: tuple[str, ...],
    profile=None,
    memory_gb: float | None = None,
) -> Problem:
    """Trace, build choices, cost and simplify once; any number of pinned solves can follow."""
    return problem_from_trace(trace_model(model, example_inputs), mesh, axis_names, profile, memory_gb)


def problem_from_trace(
    traced: TracedGraph,
    mesh: tuple[int, ...],
    axis_names: tuple[str, ...],
    profile=None,
    memory_gb: float | None = None,
) -> Problem:
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb)
    choices = build_choices(traced, mesh, axis_names)
    costed = estimate_costs(choices, cluster)
    return Problem(traced, choices, costed, merge_followers(costed, layer_regions(choices)), budget)


class Pins:
    """Allowed leader strategies, built up one predicate at a time."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.allowed: dict[str, set[int]] = {}
        self.conflicts: list[str] = []
        """Pins that could not be honoured together with the ones before them."""

    def _leader_options(self, node: str, test: Callable[[Strategy], bool]) -> tuple[str, set[int]]:
        graph = self.problem.choices.graph
        strategies = graph.nodes[node]["strategies"]
        follower = self.problem.simplified.followers.get(node)
        if follower is None:
            return node, {i for i, s in enumerate(strategies) if test(s)}
        leader, pick = follower
        return leader, {i for i, j in enumerate(pick) if test(strategies[j])}

    def require(self, node: str, test: Callable[[Strategy], bool], what: str, strict: bool = False) -> bool:
        """Keep only strategies of ``node`` passing ``test``; False (and a conflict) if none would remain."""
        leader, keep = self._leader_options(node, test)
        if leader not in self.problem.simplified.costed.nodes:
            return True  # a decision the solver never sees (one strategy)
        if self._narrow(leader, keep):
            return True
        if strict:
            raise PlanError(f"{what} cannot be executed on this mesh", hint="shard only dims that divide evenly by the mesh axes")
        self.conflicts.append(what)
        return False

    def _narrow(self, leader: str, keep: set[int]) -> bool:
        """Allow ``leader`` only strategies in ``keep`` (besides earlier limits); False, and
        nothing changed, if none would remain."""
        current = self.allowed.get(leader)
        merged = keep if current is None else current & keep
        if merged:
            self.allowed[leader] = merged
        return bool(merged)

    def value(self, node: str, out_index: int, spec: Spec, what: str, strict: bool = False) -> bool:
        """The value ``node`` outputs at ``out_index`` has placements ``spec``."""
        spec = tuple(spec)
        return self.require(node, lambda s: s.output(out_index) == spec, f"{what} as {format_spec(spec)}", strict)

    def consumed(self, node: str, input_index: int, spec: Spec, what: str) -> bool:
        """``node`` reads its input ``input_index`` with placements ``spec``."""
        spec = tuple(spec)
        return self.require(node, lambda s: s.inputs[input_index] == spec, f"{what} as {format_spec(spec)}")

    def replicate_axes(self, axes: tuple[int, ...]) -> tuple[list[str], list[str]]:
        """Every decision replicated on ``axes`` (followers included) where its options allow.

        Returns (leaders with no such strategy, left free; merged followers that split on
        ``axes`` whatever their leader does). The second happens where a follower's best
        response to a replicated input is to split its own work (a free slice), which the
        simplified problem cannot undo (``solve/simplify.py``).
        """
        simplified = self.problem.simplified
        graph = self.problem.choices.graph
        members: dict[str, list[tuple[str, tuple[int, ...] | None]]] = {}
        for name in simplified.costed.nodes:
            members[name] = [(name, None)]
        for name, (leader, pick) in simplified.followers.items():
            members[leader].append((name, pick))

        def replicated(strategy: Strategy) -> bool:
            specs = [s for s in strategy.outputs if s] + list(strategy.inputs)
            return all(spec[a] == "R" for spec in specs for a in axes)

        free, stray = [], []
        for leader, group in members.items():
            options = graph.nodes[leader]["strategies"]
            keep = {
                i for i in range(len(options))
                if all(replicated(graph.nodes[n]["strategies"][i if pick is None else pick[i]]) for n, pick in group)
            }
            if not keep:  # hold the leader at least; some followers split anyway
                keep = {i for i, strategy in enumerate(options) if replicated(strategy)}
                stray.extend(
                    n for n, pick in group[1:]
                    if any(not replicated(graph.nodes[n]["strategies"][pick[i]]) for i in keep)
                )
            if not self._narrow(leader, keep):
                free.append(leader)
        return free, stray

    def split_work(self, axis: int) -> list[str]:
        """Every op decision splits its work on ``axis`` (some operand not replicated there)
        where its options allow: data stays split on the axis instead of being gathered.

        Returns the op decisions that have no such strategy and were left free.
        """
        graph = self.problem.choices.graph
        free = []
        for leader in self.problem.simplified.costed.nodes:
            data = graph.nodes[leader]
            if data["kind"] != OP or len(data["strategies"]) == 1:
                continue
            keep = {
                i for i, strategy in enumerate(data["strategies"])
                if any(spec[axis] != "R" for spec in [*strategy.inputs, *(s for s in strategy.outputs if s)])
            }
            if not self._narrow(leader, keep):
                free.append(leader)
        return free

    def module_boundaries(self, modules: dict) -> tuple[int, int]:
        """Pin the plan's module input/output layouts; (pinned, not expressible) counts."""
        traced = self.problem.traced
        graph = self.problem.choices.graph
        owners = traced.node_modules
        order = {name: i for i, name in enumerate(graph.nodes)}
        items = {
            node.name: (node.args[0].name, node.args[1])
            for node in traced.graph_module.graph.nodes
            if node.op == "call_function" and node.target is operator.getitem
        }
        pinned = skipped = 0
        for call in traced.module_calls:
            layout = modules.get(call.fqn)
            if layout is None or call.fqn == "":
                continue

            def inside(node: str, fqn=call.fqn) -> bool:
                owner = owners.get(node, "")
                return owner == fqn or owner.startswith(fqn + ".")

            for key, node in call.inputs:
                spec = layout.inputs.get(key)
                source, out_index = items.get(node, (node, 0))
                if spec is None or source not in graph:
                    continue
                # The same consumer plan_builder read the layout from: the first one inside.
                consumers = sorted(
                    (order[v], v, k)
                    for _, v, k, data in graph.out_edges(source, keys=True, data=True)
                    if data["out_index"] == out_index and inside(v)
                )
                if not consumers:
                    continue
                # plan_builder records the layout at the start of the views before its first
                # compute op: pin what that op reads (the views are free to follow).
                _, v, k = consumers[0]
                chain = view_chain(graph, v, k, inside)
                through = spec_after_views(graph, chain, spec)
                if through is not None:
                    (v, k), spec = chain[-1], through
                ok = self.consumed(v, k, spec, f"module {call.fqn} input {key or '<arg>'}")
                pinned, skipped = pinned + ok, skipped + (not ok)
            for key, node in call.outputs:
                spec = layout.outputs.get(key)
                source, out_index = items.get(node, (node, 0))
                if spec is None or source not in graph:
                    continue
                ok = self.value(source, out_index, spec, f"module {call.fqn} output {key or '<out>'}")
                pinned, skipped = pinned + ok, skipped + (not ok)
        return pinned, skipped


def solve_pinned(problem: Problem, pins: Pins | None = None, time_limit_s: float | None = None, warnings=()) -> tuple[Plan, Solution, bool]:
    """The cheapest execution under ``pins``: (plan, solution, fits the memory budget).

    A layout that cannot fit the budget is still solved, without the budget, and comes
    back with ``fits`` False: a score must exist for plans that do not fit.
    """
    allowed = pins.allowed if pins is not None else {}
    fits = True
    try:
        solution = solve(problem.simplified.costed, problem.budget_bytes, time_limit_s, allowed)
    except InfeasibleError:
        fits = False  # over budget (or out of time, which the unbounded solve reports again)
        solution = solve(problem.simplified.costed, float("inf"), time_limit_s, allowed)
    choice = problem.simplified.expand(solution.choice)
    extra = list(warnings)
    if not fits:
        extra.append(f"this layout does not fit the {problem.budget_bytes / GIB:.3g} GiB per-device budget")
    return build_plan(problem.costed, choice, solution, extra_warnings=tuple(extra)), solution, fits
