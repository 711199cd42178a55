"""The pipeline: trace -> choices -> cost -> simplify -> solve -> plan, with a report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import nn

from autoplan.choices import INPUT, PARAMETER, build_choices
from autoplan.cost import estimate_costs
from autoplan.errors import MeshError, PlanError
from autoplan.placements import Spec, format_spec
from autoplan.plan import Plan
from autoplan.plan_builder import build_plan
from autoplan.profile import load_profile
from autoplan.simplify import merge_followers
from autoplan.solve import solve
from autoplan.trace import TracedGraph, trace_model

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
        for warning in plan.warnings:
            lines.append(f"warning: {warning}")
        return "\n".join(lines)


def suggest_with_report(
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=None,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    pinned: dict[str, Spec] | None = None,
    traced: TracedGraph | None = None,
) -> tuple[Plan, SuggestReport]:
    """Plan ``model`` for ``mesh``; ``pinned`` fixes parameter FQNs / batch keys to given specs.

    ``traced`` is the model's trace when the caller already has it (the plan cache does).
    """
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb)
    timer = _Stages()
    if traced is None:
        with timer("trace"):
            traced = trace_model(model, example_inputs)
    with timer("choices"):
        choices = build_choices(traced, mesh, axis_names)
    with timer("cost"):
        costed = estimate_costs(choices, cluster)
    with timer("simplify"):
        simplified = merge_followers(costed)
    allowed = _allowed(choices, pinned or {})
    with timer("solve"):
        solution = solve(simplified.costed, budget, time_limit_s, allowed)
    with timer("plan"):
        choice = simplified.expand(solution.choice)
        plan = build_plan(costed, choice, solution)
    report = SuggestReport(
        plan=plan,
        stage_seconds=timer.seconds,
        graph_nodes=len(traced.graph_module.graph.nodes),
        decisions=choices.graph.number_of_nodes(),
        decisions_after_merge=len(simplified.costed.nodes),
        variables=solution.variables,
        constraints=solution.constraints,
    )
    return plan, report


def resolve_options(mesh, axis_names, profile, memory_gb):
    """``(mesh, axis_names, ClusterProfile, budget bytes)`` from the user's options."""
    mesh = tuple(int(n) for n in mesh)
    axis_names = tuple(axis_names) if axis_names else DEFAULT_AXIS_NAMES.get(len(mesh), tuple(f"axis{i}" for i in range(len(mesh))))
    if len(axis_names) != len(mesh):
        raise MeshError(
            f"{len(axis_names)} axis names {list(axis_names)} for a {len(mesh)}-axis mesh {'x'.join(map(str, mesh))}",
            hint="give one name per mesh axis, e.g. --axis-names dp,tp for --mesh 2x4",
        )
    cluster = profile if hasattr(profile, "links") else load_profile(profile)
    budget = memory_gb * GIB if memory_gb else cluster.memory_bytes
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
) -> Plan:
    """Plan ``model`` (built on any device, meta included) for a device mesh; see README.

    ``cache``: reuse the plan ``plans_out/cache/`` holds for the same model, mesh,
    profile and options (``cache_dir`` moves it; ``cache=False`` always solves).
    ``broadcast``: under an initialized process group every rank must call this; rank 0
    plans and every rank returns rank 0's plan. Pass False to plan on one rank alone.
    """
    if axis_names is not None and len(axis_names) != len(tuple(mesh)) and tuple(axis_names) == ("dp", "tp"):
        axis_names = None  # the default names suit 2-D meshes only
    from autoplan.cached_suggest import suggest_on_every_rank

    options = dict(profile=profile, memory_gb=memory_gb, time_limit_s=time_limit_s)
    return suggest_on_every_rank(model, example_inputs, mesh, axis_names, options, cache, cache_dir, broadcast).plan


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
                stages.seconds[name] = time.perf_counter() - self.start

        return _Timer()
