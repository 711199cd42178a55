"""The planning problem, built once and solved by ``suggest``, ``score`` and the baselines alike.

    trace_for_planning -> build_choices -> estimate_costs -> (tie | merge followers) -> Problem
    Problem + Pins -> solve_problem -> Plan (of the whole model)

With ``tie``, a stack of identical layers is traced two layers deep and planned as one
layer repeated (``trace/repeats.py``, ``solve/tie.py``): the solver sees one set of
decisions for every layer, and the plan, widened by ``expand_plan``, still names every
layer. Whatever pins a caller adds (``pinning.py``), it solves this same problem, so a
plan ``suggest`` made scores to its own prediction.

    problem = prepare_problem(model, batch, (2, 4), ("dp", "tp"), "cpu-gloo")
    plan, solution, fits = solve_problem(problem, Pins(problem))
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

from torch import nn

from autoplan.choices.graph import ChoiceGraph, build_choices
from autoplan.cost.estimate import CostedGraph, estimate_costs
from autoplan.cost.memory import saved_values
from autoplan.cost.profile import ClusterProfile, load_profile
from autoplan.cost.regime import DEFAULT_REGIME, regime_for
from autoplan.errors import InfeasibleError, TraceError
from autoplan.model_file import default_axis_names
from autoplan.pipeline.arguments import check_axis_names, check_mesh, check_profile, warn_if_large
from autoplan.pipeline.attention_flops import attention_flops
from autoplan.pipeline.budget import MemoryBudget, budget_words, given_budget, profiles_budget
from autoplan.pipeline.repricing import StepInputs, keep_cheapest, priced_plan
from autoplan.plan.module_plan import Plan
from autoplan.solve.ilp import Solution, solve
from autoplan.solve.recompute import RecomputeUnit, stack_checkpointing, unit_for
from autoplan.solve.simplify import Simplified, layer_regions, merge_followers
from autoplan.solve.tie import block_regions, match_blocks, scale_costs, simplify_alike, tie_costs, weights
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks, find_repeated_blocks, tied_fingerprint, truncated
from autoplan.trace.tracer import TracedGraph, trace_model
from autoplan.tree_paths import readable_path
from autoplan.units import GIB  # noqa: F401 (re-exported: score and suggest print with it)


@dataclass(frozen=True)
class ModelTrace:
    """The graph planning starts from: the whole model's, or with ``blocks`` (a stack of
    identical layers) cut to its first two layers."""

    traced: TracedGraph
    blocks: RepeatedBlocks | None

    @property
    def fingerprint(self) -> str:
        """The fingerprint plans made from this trace carry."""
        return tied_fingerprint(self.traced.fingerprint, self.blocks) if self.blocks else self.traced.fingerprint

    def parameter_names(self) -> set[str]:
        """Every parameter FQN of the whole model, the layers that were not traced included."""
        return set(self._widen({fqn: None for fqns in self.traced.parameters.values() for fqn in fqns}))

    def module_names(self) -> set[str]:
        """Every module FQN of the whole model that owns parameters, as ``module_types`` lists them."""
        return set(self._widen(self.traced.module_types))

    def _widen(self, table: dict) -> dict:
        return self.blocks.widen(table) if self.blocks else table


def trace_for_planning(model: nn.Module, example_inputs, tie: bool = True, loss_fn=None,
                       expert_regions: bool = False) -> ModelTrace:
    """The model's training step (with ``loss_fn``'s loss when given), cut to two layers where ``tie`` can.
    ``expert_regions``: routed experts modules traced as regions the solver lays out (``trace_model``)."""
    blocks = find_repeated_blocks(model) if tie else None
    if blocks is None:
        return ModelTrace(trace_model(model, example_inputs, loss_fn, expert_regions), None)
    with truncated(model, blocks):
        try:
            return ModelTrace(trace_model(model, example_inputs, loss_fn, expert_regions), blocks)
        except TraceError:
            pass  # the forward reads entries the cut removed (experts indexed by number)
    return ModelTrace(trace_model(model, example_inputs, loss_fn, expert_regions), None)


def resolve_options(mesh, axis_names, profile, memory_gb, memory_gib=None, budget: MemoryBudget | None = None):
    """``(mesh, axis_names, ClusterProfile, MemoryBudget)`` from the user's options, checked
    with the command line's rules (``arguments.py``). The budget: ``memory_gb`` (10**9 bytes)
    or ``memory_gib`` (2**30 bytes), else ``budget`` (a plan's own), else the profile's
    device memory (``budget.py``)."""
    mesh = check_mesh(mesh)
    warn_if_large(mesh)
    if axis_names is None:
        axis_names = default_axis_names(mesh)
    axis_names = check_axis_names(axis_names, mesh)
    given = given_budget(memory_gb, memory_gib)
    check_profile(profile)
    cluster = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
    return mesh, axis_names, cluster, given or budget or profiles_budget(cluster)


@dataclass(frozen=True)
class Problem:
    """One model traced, its choices costed and simplified (tied where its layers allow),
    for one mesh, profile and budget."""

    trace: ModelTrace
    """What was traced; ``trace.blocks`` is the tied stack, None when untied."""
    choices: ChoiceGraph
    costed: CostedGraph
    """Costs of every traced decision (followers included), weighted to the whole model:
    what predictions are computed from."""
    simplified: Simplified
    """Followers merged into their leaders (each traced layer into its own)."""
    twins: dict[str, str]
    """Layer-1 leader -> the layer-0 leader it is tied to; empty when untied."""
    reduced: CostedGraph
    """What the solver sees: leaders only, layer-1 leaders folded into their twins."""
    budget_bytes: float
    """Per-device memory budget."""
    stage_seconds: dict[str, float]
    """How long preparing took, per stage (trace, choices, cost, simplify)."""
    layers: LayerStack | None = None
    """The repeated layers the solver may checkpoint (tied problems only)."""
    budget: MemoryBudget | None = None
    """``budget_bytes`` as it was given (its unit, where it comes from), for printing."""
    regime_warning: str | None = None
    """Where the regime priced differs from the one asked (``cost/regime.py``), why."""
    step: StepInputs | None = None
    """The model and batch, for a dry run of each plan's step: what its price is made from
    (``repricing.py``). None: priced by the cost stage and the rules of ``plan/collectives.py``."""

    @property
    def regime(self) -> str:
        """The compile regime the step is priced for."""
        return self.costed.regime

    def budget_words(self) -> str:
        """The budget in the unit it was given, in bytes, and where it comes from."""
        return budget_words(self.budget_bytes, self.budget)

    def layer_names(self) -> tuple[str, ...] | None:
        """Every layer of the repeated stack by FQN (what a plan's ``recompute`` names), or None."""
        blocks = self.blocks
        return tuple(blocks.layer_prefix(i) for i in range(blocks.count)) if blocks and self.layers else None

    def recompute_mode(self, plan: Plan) -> tuple[str, int] | bool:
        """How to score ``plan``: its own (mode, layers) where it checkpoints the first layers
        of the stack alike, else no checkpointing."""
        return stack_checkpointing(plan.recompute, self.layer_names()) or False

    @property
    def traced(self) -> TracedGraph:
        return self.trace.traced

    @property
    def blocks(self) -> RepeatedBlocks | None:
        return self.trace.blocks

    @property
    def profile(self) -> ClusterProfile:
        return self.costed.profile

    def node_of(self, name: str) -> str | None:
        """Placeholder node of a parameter FQN (any tied alias) or a batch key path (as the
        plan keys it, or as ``tree_paths.readable_path`` prints it). A
        parameter of a layer that was not traced is the last traced layer's: they are tied."""
        blocks = self.blocks
        layer = blocks.layer_of(name) if blocks else None
        if blocks and layer is not None and layer >= KEPT_LAYERS:
            name = blocks.rename(name, KEPT_LAYERS - 1)
        for node, fqns in self.traced.parameters.items():
            if name in fqns:
                return node
        for node, key in self.traced.inputs.items():
            if name in (key, readable_path(key)):  # "[1]['input_ids']" or "input_ids"
                return node
        return None

    def expand(self, choice: dict[str, int]) -> dict[str, int]:
        """A solution of the reduced problem as a strategy for every traced decision."""
        leaders = dict(choice)
        for b, a in self.twins.items():
            leaders[b] = choice[a]
        return self.simplified.expand(leaders)


def prepare_problem(
    model: nn.Module,
    example_inputs,
    mesh,
    axis_names=None,
    profile=None,
    memory_gb: float | None = None,
    *,
    memory_gib: float | None = None,
    budget: MemoryBudget | None = None,
    tie: bool = True,
    trace: ModelTrace | None = None,
    loss_fn=None,
    progress=None,
    regime: str = DEFAULT_REGIME,
    expert_regions: bool = False,
) -> Problem:
    """Trace, build choices, cost and simplify once; any number of pinned solves can follow.

    ``trace`` is ``trace_for_planning``'s result when the caller already has it (the plan
    cache and ``score`` do); ``tie`` then is read from it. When the two traced layers turn
    out to differ, the whole model is traced and planned untied. ``loss_fn(output, batch)``
    is the training loss (default: the model's own, ``trace/loss.py``). ``progress(text)``
    hears each stage as it starts (the command line's live status line). The budget:
    ``memory_gb`` (10**9 bytes) or ``memory_gib`` (2**30 bytes), else ``budget``, else the
    profile's device memory. ``regime``: how the step runs, eagerly ("none") or under
    ``torch.compile`` per "block" or "whole" (``cost/regime.py``). ``expert_regions``: the
    experts' layout is a decision of the solver, expert parallel included (``trace_model``).
    """
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb, memory_gib, budget)
    seconds: dict[str, float] = {}
    if trace is None:
        with timed(seconds, "trace", progress):
            trace = trace_for_planning(model, example_inputs, tie, loss_fn, expert_regions)
    with timed(seconds, "choices", progress):
        choices = build_choices(trace.traced, mesh, axis_names)
    blocks = trace.blocks
    regions = block_regions(choices, blocks) if blocks else None
    twins = match_blocks(choices, regions) if regions is not None else None
    if blocks and twins is None:  # the two traced layers differ: plan the whole model untied
        blocks, regions = None, None
        with timed(seconds, "trace", progress):
            trace = ModelTrace(trace_model(model, example_inputs, loss_fn, expert_regions), None)
        with timed(seconds, "choices", progress):
            choices = build_choices(trace.traced, mesh, axis_names)
    node_weight, reads = weights(regions, blocks.count) if blocks and regions is not None else (None, None)
    # The stack a per-block compile compiles: the tied one, else found on the model itself.
    priced, regime_warning = regime_for(regime, trace.blocks or (find_repeated_blocks(model) if regime == "block" else None))
    with timed(seconds, "cost", progress):
        costed = estimate_costs(choices, cluster, reads, priced)
    with timed(seconds, "simplify", progress):
        if blocks and regions is not None and twins is not None:
            tied = tie_costs(simplify_alike(costed, regions, twins), twins, node_weight)
            simplified, twins, reduced = tied.simplified, tied.twins, tied.costed
            costed = scale_costs(costed, node_weight)
        else:
            simplified = merge_followers(costed, layer_regions(choices))
            twins, reduced = {}, simplified.costed
    layers = layer_stack(choices, regions, simplified, reduced, blocks) if blocks else None
    step = StepInputs(model, example_inputs, loss_fn)
    return Problem(trace, choices, costed, simplified, twins, reduced, budget.bytes, seconds, layers, budget,
                   regime_warning, step)


def at_budget(problem: Problem, memory_gb: float | None = None, *, memory_gib: float | None = None) -> Problem:
    """The same problem under another per-device budget (``memory_gb``: 10**9 bytes,
    ``memory_gib``: 2**30 bytes, neither: the profile's device memory). Tracing and costing
    do not depend on the budget, so plans for several budgets share one preparation."""
    budget = given_budget(memory_gb, memory_gib) or profiles_budget(problem.profile)
    return replace(problem, budget_bytes=budget.bytes, budget=budget)


@dataclass(frozen=True)
class LayerStack:
    """The repeated layers as the solver sees them (``unit``) and as predictions are made
    from them (every traced decision in them, followers included)."""

    unit: RecomputeUnit
    decisions: frozenset[str]
    freed: frozenset[str]
    inputs: frozenset[str] = frozenset()
    """The first layer's outputs nothing saves, which a checkpointed layer keeps as its input."""


def layer_stack(choices, regions, simplified: Simplified, reduced: CostedGraph, blocks: RepeatedBlocks) -> LayerStack:
    """The traced layers' decisions, and those whose saved outputs a checkpoint frees: all
    but the layers' outputs (a value read outside its own layer), which the next layer's
    checkpoint keeps as its input, or the loss reads."""
    graph = choices.graph
    inside = {n for n, r in regions.items() if r is not None}
    outputs = {u for u, v in graph.edges() if regions[u] is not None and regions[v] != regions[u]}
    leader = {name: follower[0] for name, follower in simplified.followers.items()}
    kept = {leader.get(n, n) for n in outputs}
    freed = frozenset(inside - outputs - {n for n in inside if leader.get(n, n) in kept})
    saved = saved_values(choices)
    inputs = frozenset(n for n in outputs if regions[n] == 0 and (n, 0) not in saved)  # the checkpoints keep these
    unit = RecomputeUnit(
        decisions=frozenset(n for n in reduced.nodes if n in inside),
        freed=frozenset(n for n in reduced.nodes if n in inside and n not in kept),
        layers=blocks.count,
        modules=tuple(blocks.layer_prefix(i) for i in range(KEPT_LAYERS)),
        inputs=frozenset(n for n in inputs if n in reduced.nodes),  # a merged follower's bytes are not its leader's
    )
    return LayerStack(unit, frozenset(inside), freed, inputs)


def solve_problem(
    problem: Problem,
    pins,
    time_limit_s: float | None = None,
    warnings=(),
    *,
    over_budget: bool = False,
    seconds: dict[str, float] | None = None,
    progress=None,
    recompute: bool | str | tuple[str, int] = False,
    reprice: bool = False,
    tables: bool = True,
) -> tuple[Plan, Solution, bool]:
    """The cheapest plan under ``pins`` (a ``pinning.Pins``; ``Pins(problem)`` pins only
    what every plan pins): (plan of the whole model, solution, fits the memory budget).

    With ``over_budget``, a layout that cannot fit the budget is still solved, without the
    budget, and comes back with ``fits`` False: a score must exist for plans that do not
    fit. Without it, that is an InfeasibleError. ``seconds`` gets the solve and plan stages' times.
    ``recompute``: the solver may checkpoint the repeated layers (``solve/recompute.py``);
    a mode's name holds it to that mode (scoring a plan that checkpoints). Every plan is
    priced by its step (``repricing.plan_of``); with ``reprice`` the solver's choice is too:
    candidate plans priced by their step, the cheapest kept (``repricing.keep_cheapest``).
    ``tables`` False: a plan priced by the cost stage comes without collective tables
    (``repricing.priced_plan``).
    """
    seconds = {} if seconds is None else seconds
    allowed = pins.allowed
    unit = unit_for(problem.layers.unit if problem.layers is not None else None, recompute)
    fits = True
    with timed(seconds, "solve", progress):
        try:
            solution = solve(problem.reduced, problem.budget_bytes, time_limit_s, allowed, unit,
                             budget_words=problem.budget_words())
        except InfeasibleError:
            if not over_budget:
                raise
            fits = False  # over budget (or out of time, which the unbounded solve reports again)
            held = unit if unit is not None and unit.forced is not None else None  # a forced mode is the layout's
            solution = solve(problem.reduced, float("inf"), time_limit_s, allowed, held)
    extra = list(warnings) + ([problem.regime_warning] if problem.regime_warning else [])
    if not fits:
        extra.append(f"this layout does not fit the per-device budget of {problem.budget_words()}")
    with timed(seconds, "plan", progress):
        plan, counted = priced_plan(problem, solution, tuple(extra), tables=tables)
    if reprice and fits:

        # Candidates keep the optimum's checkpointing: they differ in layout, and each is one solve.
        kept = (solution.recompute, solution.recompute_layers) if solution.recompute else False
        held = unit_for(problem.layers.unit, kept) if unit is not None and problem.layers is not None else None

        def solve_again(excluded):
            with timed(seconds, "reprice", progress if "reprice" not in seconds else None):
                return solve(problem.reduced, problem.budget_bytes, time_limit_s, allowed, held, excluded=excluded)

        def price(*args):
            with timed(seconds, "reprice"):
                return priced_plan(*args)

        plan, solution, _ = keep_cheapest(problem, solution, plan, solve_again, tuple(extra), counted, price)
    plan = replace(plan, attention_flops=attention_flops(problem.traced, problem.blocks))
    return plan, solution, fits


_STAGE_WORDS = {
    "trace": "tracing the model", "choices": "building the placement choices", "cost": "costing the choices",
    "simplify": "merging followers", "solve": "solving the ILP", "plan": "writing the plan",
    "reprice": "pricing other candidate plans by their step",
}


@contextmanager
def timed(seconds: dict[str, float], stage: str, progress=None):
    """Add the time the block takes to ``seconds[stage]``; tell ``progress`` it started."""
    if progress is not None:
        progress(_STAGE_WORDS.get(stage, stage))
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - start
