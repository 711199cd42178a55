"""Pins: the planning problem with some decisions fixed.

Scoring a plan, building baseline plans and ``suggest``'s pinned placements all ask the
same question: "what is the cheapest execution of this layout?" A layout fixes some
values' placements (parameters, batch inputs, the tensors crossing module boundaries) and
leaves the rest to the solver (``problem.solve_problem``).

A pin is a predicate on one decision's strategy. The solver works on the reduced
problem, where a merged follower has no variable of its own, so a pin on a follower
becomes a pin on its leader: the leader strategies ``i`` whose best response ``pick[i]``
satisfies the predicate (``solve/simplify.py``). With identical layers tied, a pin on a
decision of the second traced layer becomes a pin on its twin in the first, and a pin on
a layer that was not traced becomes one on the last traced layer (``Problem.node_of``). Pins
intersect; a pin that would leave a decision no strategy is reported as a conflict, never
silently dropped. Pins that lay out tied layers differently cannot all hold: plan such a
layout untied (``prepare_problem(..., tie=False)``; ``trace/repeats.laid_out_alike`` tells).

    problem = prepare_problem(model, batch, (2, 4), ("dp", "tp"), "cpu-gloo")
    pins = Pins(problem)
    pins.place("model.layers.0.mlp.up_proj.weight", ("R", "S(0)"))   # a parameter FQN or batch key path
    plan, solution, fits = solve_problem(problem, pins)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autoplan.choices.graph import OP, PARAMETER
from autoplan.dtensor.strategies import Strategy, is_inplace
from autoplan.errors import PlanError
from autoplan.pipeline.problem import Problem
from autoplan.placements import Spec, format_spec, layout_problem
from autoplan.plan.views import reshaping_readers, spec_after_views, view_chain, within


class Pins:
    """Allowed leader strategies, built up one predicate at a time."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.allowed: dict[str, set[int]] = {}
        self.conflicts: list[str] = []
        """Pins that could not be honoured together with the ones before them."""
        self._inplace_selves_as_made()

    def _inplace_selves_as_made(self) -> None:
        """An in-place op merged into its self's leader runs on self as it was made: DTensor
        refuses to move an in-place op's self (``add_`` on the partial mean of an RMSNorm
        split by its normalized dim, as ``F.rms_norm`` decomposes on the CPU). A leader
        strategy that would hand such an op another layout than it reads is not allowed,
        where some other is (else the plan says so in its warnings)."""
        graph = self.problem.choices.graph
        simplified = self.problem.simplified
        for name, (leader, pick) in simplified.followers.items():
            target = graph.decision(name).fx_node.target
            if not isinstance(target, torch._ops.OpOverload) or not is_inplace(target):
                continue
            [(u, out_index, k)] = graph.inputs_of(name)
            if k != 0:
                continue
            reads = graph.decision(name).strategies
            keep = {i for i, j in enumerate(pick) if simplified.output_under_leader(u, out_index, i) == reads[j].inputs[0]}
            if keep:
                self._narrow(leader, keep)

    def _leader_options(self, node: str, test: Callable[[Strategy], bool]) -> tuple[str, set[int]]:
        graph = self.problem.choices.graph
        strategies = graph.decision(node).strategies
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
        if strict and not keep:
            raise PlanError(f"{what} cannot be executed on this mesh", hint="shard only dims that divide evenly by the mesh axes")
        if strict:
            raise PlanError(
                f"{what} contradicts an earlier pin on the same decision",
                hint="pin a parameter and its aliases alike"
                + (", and identical layers alike (or plan with tie=False)" if self.problem.twins else ""),
            )
        self.conflicts.append(what)
        return False

    def place(self, name: str, spec: Spec, what: str | None = None) -> bool:
        """The parameter FQN or batch key path ``name`` has placements ``spec``; a PlanError
        when it cannot."""
        node = self.problem.node_of(name)
        if node is None:
            raise PlanError(f"pinned name {name!r} is neither a parameter nor a batch input",
                            hint="use FQNs from named_parameters() or batch inputs by name (input_ids, args[0]) or key path")
        decision = self.problem.choices.graph.decision(node)
        shape = tuple(decision.fx_node.meta["val"].shape)
        problem = layout_problem(tuple(spec), shape, self.problem.choices.mesh_shape, several_axes=decision.kind == PARAMETER)
        if problem:
            raise PlanError(
                f"{what or name} as {format_spec(tuple(spec))} cannot be executed on this mesh: {problem}",
                hint="shard only dims the tensor has, by mesh axes whose sizes divide them"
                + ("" if decision.kind == PARAMETER else " (one axis per dim; a stored parameter may use several)"),
            )
        return self.value(node, 0, spec, what or name, strict=True)

    def _narrow(self, leader: str, keep: set[int]) -> bool:
        """Allow ``leader`` only strategies in ``keep`` (besides earlier limits); False, and
        nothing changed, if none would remain. A tied leader's limits are its twin's."""
        leader = self.problem.twins.get(leader, leader)
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
        reduced problem cannot undo (``solve/simplify.py``).
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

        free: list[str] = []
        stray: list[str] = []
        for leader, group in members.items():
            options = graph.decision(leader).strategies
            keep = {
                i for i in range(len(options))
                if all(replicated(graph.decision(n).strategies[i if pick is None else pick[i]]) for n, pick in group)
            }
            if not keep:  # hold the leader at least; some followers split anyway
                keep = {i for i, strategy in enumerate(options) if replicated(strategy)}
                stray.extend(
                    n for n, pick in group[1:]  # followers: each has its pick
                    if pick is not None and any(not replicated(graph.decision(n).strategies[pick[i]]) for i in keep)
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
            decision = graph.decision(leader)
            if decision.kind != OP or len(decision.strategies) == 1:
                continue
            keep = {
                i for i, strategy in enumerate(decision.strategies)
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
        pinned = skipped = 0
        for call in traced.module_calls:
            layout = modules.get(call.fqn)
            if layout is None or call.fqn == "":
                continue

            def inside(node: str, fqn=call.fqn) -> bool:
                return within(owners.get(node, ""), fqn)

            for key, node in call.inputs:
                spec = layout.inputs.get(key)
                source, out_index = traced.value_of(node)
                if spec is None or source not in graph:
                    continue
                # The same consumer plan/builder.py read the layout from: the first one inside.
                consumers = sorted(
                    (order[v], v, k)
                    for _, v, k, read in graph.reads(source)
                    if read == out_index and inside(v)
                )
                if not consumers:
                    continue
                # plan/builder.py records the layout at the start of the views before its first
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
                source, out_index = traced.value_of(node)
                if spec is None or source not in graph:
                    continue
                what = f"module {call.fqn} output {key or '<out>'}"
                # Read only by reshaping views: handed over as they read it, whatever made it.
                readers = reshaping_readers(graph, owners, source, out_index, call.fqn)
                ok = all(self.consumed(v, k, spec, what) for v, k in readers) if readers else \
                    self.value(source, out_index, spec, what)
                pinned, skipped = pinned + ok, skipped + (not ok)
        return pinned, skipped
