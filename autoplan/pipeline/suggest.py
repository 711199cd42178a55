"""The pipeline: trace -> choices -> cost -> simplify -> solve -> plan, with a report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import nn

from autoplan.choices.graph import INPUT, PARAMETER, build_choices
from autoplan.cost.estimate import estimate_costs
from autoplan.arguments import check_axis_names, check_mesh, check_model, check_positive, check_profile, warn_if_large
from autoplan.errors import PlanError, TraceError
from autoplan.placements import Spec, format_spec
from autoplan.plan.module_plan import Plan
from autoplan.plan.builder import build_plan
from autoplan.cost.profile import ClusterProfile, load_profile
from autoplan.solve.simplify import layer_regions, merge_followers
from autoplan.solve.ilp import solve
from autoplan.plan.expand import expand_plan
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks, find_repeated_blocks, tied_fingerprint, truncated
from autoplan.solve.tie import block_regions, match_blocks, scale_costs, simplify_alike, tie_costs, weights
from autoplan.trace.tracer import TracedGraph, trace_model

GIB = 2**30
DEFAULT_AXIS_NAMES = {1: ("dp",), 2: ("dp", "tp"), 3: ("dp", "cp", "tp")}


@dataclass(frozen=True)
class SuggestReport:
    """What a run did and how long each stage took (kept out of the plan file)."""

    plan: Plan
    stage_seconds: dict[str, float]
    graph_nodes: int
    decisions: int
    decisions_after_merge: int
    variables: int
    constraints: int
    model_name: str = ""
    extra: dict = field(default_factory=dict)

    def stats(self) -> dict:
        """The run's numbers (stage seconds, graph and ILP sizes, solver outcome) as plain data."""
        s = self.plan.solver
        return {
            "stage_seconds": {k: round(v, 4) for k, v in self.stage_seconds.items()},
            "graph_nodes": self.graph_nodes,
            "decisions": self.decisions,
            "decisions_after_merge": self.decisions_after_merge,
            "variables": self.variables,
            "constraints": self.constraints,
            "solver": {"status": s.status, "objective_s": s.objective, "bound_s": s.bound, "gap": s.gap},
            "step_time_s": self.plan.predicted.step_time_s,
            "peak_memory_bytes": self.plan.predicted.peak_memory_bytes,
            **self.extra,
        }

    def summary(self) -> str:
        plan = self.plan
        p = plan.predicted
        mesh = "x".join(map(str, plan.mesh_shape))
        lines = [f"mesh {mesh} ({', '.join(plan.axis_names)}), profile {plan.profile}"]
        lines.append("parameters (placement per mesh axis):")
        width = max((len(f) for f in plan.parameters), default=0)
        for fqn, spec in plan.parameters.items():
            lines.append(f"  {fqn:<{width}}  {format_spec(spec)}")
        lines.append("batch:")
        for key, batch in plan.inputs.items():
            lines.append(f"  {key}  shape {list(batch.shape)}  {format_spec(batch.placements)}")
        lines.append(
            f"predicted step time {p.step_time_s * 1e3:.3f} ms "
            f"(compute {p.compute_s * 1e3:.3f} ms, communication {p.comm_s * 1e3:.3f} ms)"
        )
        lines.append(
            f"peak memory per device {p.peak_memory_bytes / GIB:.2f} GiB "
            f"(model state {p.model_state_bytes / GIB:.2f} GiB, activations {p.activation_bytes / GIB:.2f} GiB)"
        )
        s = plan.solver
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in self.stage_seconds.items())
        lines.append(
            f"solver {s.status}, gap {s.gap:.2%}; {self.graph_nodes} graph nodes, {self.decisions} decisions "
            f"({self.decisions_after_merge} after merging followers), {self.variables} ILP variables"
        )
        lines.append(f"time: {stages}")
        if "tied" in self.extra:
            lines.append(f"identical layers planned alike: {self.extra['tied']}; solver status and gap are those of the tied problem")
        for warning in plan.warnings:
            lines.append(f"warning: {warning}")
        return "\n".join(lines)


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


def trace_for_planning(model: nn.Module, example_inputs, tie: bool = True) -> ModelTrace:
    blocks = find_repeated_blocks(model) if tie else None
    if blocks is None:
        return ModelTrace(trace_model(model, example_inputs), None)
    with truncated(model, blocks):
        try:
            return ModelTrace(trace_model(model, example_inputs), blocks)
        except TraceError:
            pass  # the forward reads entries the cut removed (experts indexed by number)
    return ModelTrace(trace_model(model, example_inputs), None)


def suggest_with_report(
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=None,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    pinned: dict[str, Spec] | None = None,
    tie: bool = True,
    trace: ModelTrace | None = None,
) -> tuple[Plan, SuggestReport]:
    """Plan ``model`` for ``mesh``; ``pinned`` fixes parameter FQNs / batch keys to given specs.

    With ``tie``, a stack of identical layers is traced two layers deep and planned as one
    layer repeated (``trace/repeats.py``, ``solve/tie.py``); the plan still names every layer.
    ``trace`` is ``trace_for_planning``'s result when the caller already has it (the plan
    cache does); it must have been made with the same ``tie``.
    """
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb)
    timer = _Stages()
    if trace is None:
        with timer("trace"):
            trace = trace_for_planning(model, example_inputs, tie)
    traced, blocks = trace.traced, trace.blocks
    with timer("choices"):
        choices = build_choices(traced, mesh, axis_names)
    regions = block_regions(choices, blocks) if blocks else None
    twins = match_blocks(choices, regions) if blocks else None
    if blocks and twins is None:  # the two traced layers differ: plan the whole model untied
        blocks, regions = None, None
        with timer("trace"):
            traced = trace_model(model, example_inputs)
        with timer("choices"):
            choices = build_choices(traced, mesh, axis_names)
    node_weight, reads = weights(regions, blocks.count) if blocks else (None, None)
    with timer("cost"):
        costed = estimate_costs(choices, cluster, reads)
    with timer("simplify"):
        if blocks:
            tied = tie_costs(simplify_alike(costed, regions, twins), twins, node_weight)
            problem, expand = tied.costed, tied.expand
        else:
            simplified = merge_followers(costed, layer_regions(choices))
            problem, expand = simplified.costed, simplified.expand
    allowed = _allowed(choices, _pinned_in_trace(pinned or {}, blocks))
    if blocks:
        allowed = _fold_allowed(allowed, tied.twins)
    with timer("solve"):
        solution = solve(problem, budget, time_limit_s, allowed)
    with timer("plan"):
        choice = expand(solution.choice)
        plan = build_plan(scale_costs(costed, node_weight) if blocks else costed, choice, solution)
        if blocks:
            plan = expand_plan(plan, blocks)
    report = SuggestReport(
        plan=plan,
        stage_seconds=timer.seconds,
        graph_nodes=len(traced.graph_module.graph.nodes),
        decisions=choices.graph.number_of_nodes(),
        decisions_after_merge=len(problem.nodes),
        variables=solution.variables,
        constraints=solution.constraints,
        extra={
            "search_s": solution.search_s,
            "search_cpu_s": solution.search_cpu_s,
            "stopped_by_time_limit": solution.stopped_by_time_limit,
        } | (
            {"tied": f"{blocks.count} x {blocks.layer_class} at {blocks.fqn} ({KEPT_LAYERS} traced)"} if blocks else {}
        ),
    )
    return plan, report


def resolve_options(mesh, axis_names, profile, memory_gb):
    """``(mesh, axis_names, ClusterProfile, budget bytes)`` from the user's options, checked
    with the command line's rules (``arguments.py``)."""
    mesh = check_mesh(mesh)
    warn_if_large(mesh)
    if axis_names is None:
        axis_names = DEFAULT_AXIS_NAMES.get(len(mesh), tuple(f"axis{i}" for i in range(len(mesh))))
    axis_names = check_axis_names(axis_names, mesh)
    memory_gb = check_positive("memory_gb", memory_gb)
    check_profile(profile)
    cluster = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
    budget = memory_gb * GIB if memory_gb is not None else cluster.memory_bytes
    return mesh, axis_names, cluster, budget


def suggest(
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=("dp", "tp"),
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    *,
    cache: bool = True,
    cache_dir=None,
    broadcast: bool = True,
    tie: bool = True,
) -> Plan:
    """Plan ``model`` (built on any device, meta included) for a device mesh; see README.

    ``cache``: reuse the plan ``plans_out/cache/`` holds for the same model, mesh,
    profile and options (``cache_dir`` moves it; ``cache=False`` always solves).
    ``broadcast``: under an initialized process group every rank must call this; rank 0
    plans and every rank returns rank 0's plan. Pass False to plan on one rank alone.
    ``tie``: plan a stack of identical layers once (see ``suggest_with_report``).
    """
    check_model(model, example_inputs)
    mesh = check_mesh(mesh)
    check_positive("time_limit_s", time_limit_s)
    if isinstance(axis_names, tuple) and len(axis_names) != len(mesh) and axis_names == ("dp", "tp"):
        axis_names = None  # the default names suit 2-D meshes only
    from autoplan.pipeline.cached import suggest_on_every_rank

    options = dict(profile=profile, memory_gb=memory_gb, time_limit_s=time_limit_s, tie=tie)
    return suggest_on_every_rank(model, example_inputs, mesh, axis_names, options, cache, cache_dir, broadcast).plan




def _pinned_in_trace(pinned: dict[str, Spec], blocks: RepeatedBlocks | None) -> dict[str, Spec]:
    """Pins on layers that were not traced, moved to the last traced layer (they are tied)."""
    if blocks is None:
        return pinned
    moved: dict[str, Spec] = {}
    for name, spec in pinned.items():
        layer = blocks.layer_of(name)
        key = blocks.rename(name, KEPT_LAYERS - 1) if layer is not None and layer >= KEPT_LAYERS else name
        if key in moved and moved[key] != tuple(spec):
            raise PlanError(f"pinned {name} differs from another layer's pin on the same parameter",
                            hint="identical layers are planned alike: pin them alike, or pass tie=False")
        moved[key] = tuple(spec)
    return moved


def _fold_allowed(allowed: dict[str, set[int]], twins: dict[str, str]) -> dict[str, set[int]]:
    folded: dict[str, set[int]] = {}
    for name, keep in allowed.items():
        target = twins.get(name, name)
        folded[target] = folded[target] & keep if target in folded else set(keep)
    return folded


def _allowed(choices, pinned: dict[str, Spec]) -> dict[str, set[int]]:
    """Strategy indices that keep each pinned parameter / batch input at its given spec."""
    traced = choices.traced
    by_name = {fqn: node for node, fqns in traced.parameters.items() for fqn in fqns}
    by_name.update({key: node for node, key in traced.inputs.items()})
    allowed: dict[str, set[int]] = {}
    for name, spec in pinned.items():
        node = by_name.get(name)
        if node is None:
            raise PlanError(f"pinned name {name!r} is neither a parameter nor a batch input", hint="use FQNs from named_parameters() or batch key paths")
        kind = choices.graph.nodes[node]["kind"]
        assert kind in (PARAMETER, INPUT)
        keep = {i for i, s in enumerate(choices.strategies(node)) if s.outputs[0] == tuple(spec)}
        if not keep:
            raise PlanError(f"{name} cannot be placed {format_spec(tuple(spec))} on this mesh", hint="shard only dims that divide evenly by the mesh axes")
        allowed[node] = keep
    return allowed


class _Stages:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str):
        stages = self

        class _Timer:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                stages.seconds[name] = stages.seconds.get(name, 0.0) + time.perf_counter() - self.start

        return _Timer()
