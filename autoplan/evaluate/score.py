"""Score any plan: its predicted step time, the time's breakdown and its peak memory.

A plan fixes the placements of parameters, batch inputs and the tensors that cross
module boundaries; the ops between boundaries run however DTensor propagates them. The
score of a plan is the cheapest execution of its layout under the cost model: the
planning problem (``pipeline/problem.py``) is prepared for the plan's mesh, every
parameter, batch input and module boundary layout the plan names is pinned
(``pipeline/pinning.py``), and the solver picks the rest.

The problem is the one the plan's planner solved: with identical layers tied when the
plan was planned tied (its fingerprint says so) and still lays every layer out alike,
else the whole model (a hand-edited layer, or a plan made with ``tie=False``). So for a
plan that ``suggest`` wrote, with the same profile and budget, the score is the plan's own
prediction again: the plan's solution satisfies every pin, and it was the optimum of a
larger problem.

A module boundary layout that cannot be pinned alongside the others (a hand-edited plan
whose module layouts contradict its parameters, say) is skipped and counted: the score
is then of the parameter and batch layout plus the boundaries that could be honoured.

    score = autoplan.score(model, batch, plan, profile="cpu-gloo")
    score.step_time_s, score.compute_s, score.comm_s, score.peak_memory_bytes
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoplan.cost.profile import ClusterProfile, load_profile
from autoplan.dtensor import context_attention
from autoplan.errors import PlanError, ProfileError
from autoplan.explain.show import peak_memory_lines
from autoplan.pipeline.budget import MemoryBudget, budget_words, plans_budget
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import ModelTrace, Problem, prepare_problem, solve_problem, trace_for_planning
from autoplan.plan.module_plan import Plan
from autoplan.trace.repeats import find_repeated_blocks, laid_out_alike
from autoplan.trace.tracer import trace_model
from autoplan.tree_paths import readable_path


@dataclass(frozen=True)
class Score:
    """What one step of a plan costs, predicted by one cluster profile."""

    step_time_s: float
    """Compute plus communication, seconds (no overlap assumed)."""
    compute_s: float
    comm_s: float
    peak_memory_bytes: int
    """Per device: model state plus activations kept for backward."""
    model_state_bytes: int
    activation_bytes: int
    fits: bool
    """Whether the peak fits the per-device memory budget."""
    budget_bytes: float
    """The budget judged against: the one given, else the plan's own, else the profile's device memory."""
    profile: str
    pinned_values: int
    """Parameters and batch inputs pinned."""
    pinned_boundaries: int
    """Module boundary layouts pinned."""
    skipped_boundaries: tuple[str, ...]
    """Module boundary layouts that could not be pinned (see the module docstring)."""
    plan: Plan
    """The scored plan as re-solved: same layout, its prediction under ``profile``."""
    budget: MemoryBudget | None = None
    """``budget_bytes`` as given (its unit) and where it comes from."""

    def summary(self) -> str:
        mesh = "x".join(map(str, self.plan.mesh_shape))
        lines = [
            f"mesh {mesh} ({', '.join(self.plan.axis_names)}), profile {self.profile}",
            (f"predicted step time {self.step_time_s * 1e3:.3f} ms "
            f"(compute {self.compute_s * 1e3:.3f} ms, communication {self.comm_s * 1e3:.3f} ms)"),
            *peak_memory_lines(self.plan),
            ("fits" if self.fits else "does NOT fit") + f" the per-device budget of {budget_words(self.budget_bytes, self.budget)}",
            f"pinned {self.pinned_values} parameters and batch inputs, {self.pinned_boundaries} module boundary layouts"
            + (f" ({len(self.skipped_boundaries)} could not be pinned)" if self.skipped_boundaries else ""),
        ]
        lines.extend(f"not pinned: {what}" for what in self.skipped_boundaries)
        return "\n".join(lines)


def score(
    model: nn.Module,
    example_inputs,
    plan: Plan,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    mesh: tuple[int, ...] | None = None,
    loss_fn=None,
    progress=None,
    *,
    memory_gib: float | None = None,
    microbatches: int | None = None,
) -> Score:
    """Score ``plan`` for ``model`` on ``example_inputs`` (meta tensors are fine).

    ``profile`` (a name, a path or a ClusterProfile) defaults to the profile the plan was
    made with. ``mesh``, when given, must be the plan's mesh shape. ``loss_fn`` is the
    training loss the plan was made for (as ``suggest``'s). The budget the peak is judged
    against: ``memory_gb`` (10**9 bytes) or ``memory_gib`` (2**30 bytes), else the one the
    plan was made under (its file records it), else the profile's device memory.
    The step is priced in the regime the plan was (``plan.regime``: eager or compiled).
    ``progress(text)`` hears each stage as it starts. A plan with pipeline stages, or one
    run as ``microbatches`` steps of gradient accumulation, is priced as the pipeline
    planner prices (``evaluate/score_microbatched.py``).
    """
    if plan.pipeline is not None or microbatches is not None:
        from autoplan.evaluate.score_microbatched import score_microbatched

        return score_microbatched(model, example_inputs, plan, profile, memory_gb, time_limit_s, loss_fn, progress,
                                  memory_gib=memory_gib, microbatches=microbatches, mesh=mesh)
    _check_mesh(plan, mesh)
    cluster = plan_profile(plan, profile)
    if progress is not None:
        progress("tracing the model to check the plan against it")
    # A plan with a context axis is traced and priced under that axis's attention rule.
    layout = plan.context_parallel
    with context_attention.active(None if layout is None else layout.axis_index):
        trace, accepted = check_plan_for_model(model, example_inputs, plan, loss_fn)  # fails fast, before the costly stages
        problem = prepare_problem(
            model, example_inputs, plan.mesh_shape, plan.axis_names, cluster, memory_gb, memory_gib=memory_gib,
            budget=plans_budget(plan), trace=trace, loss_fn=loss_fn, progress=progress, regime=plan.regime,
        )
        if progress is not None:
            progress("solving the plan's cheapest execution")
        return score_problem(problem, plan, time_limit_s, accepted)


def check_plan_for_model(
    model: nn.Module, example_inputs, plan: Plan, loss_fn=None, command: str = "score"
) -> tuple[ModelTrace, set[str]]:
    """Trace ``model`` (with ``loss_fn``'s loss) and check that ``plan`` was made for it
    (parameters, batch shapes, modules, model fingerprint, a tied plan's included); returns
    the trace to score the plan on (see the module docstring) and the fingerprints
    accepted. A mismatch is a PlanError naming it, whose fix names ``command`` (what the
    user is running: "score", "verify", "explain", "report")."""
    whole = ModelTrace(trace_model(model, example_inputs, loss_fn), None)
    planned = whole
    if plan.fingerprint != whole.fingerprint and find_repeated_blocks(model) is not None:
        tied = trace_for_planning(model, example_inputs, loss_fn=loss_fn)
        if tied.blocks is not None and plan.fingerprint == tied.fingerprint:
            planned = tied
    accepted = {whole.fingerprint, planned.fingerprint}
    _check_model(whole, plan, accepted, command)
    if not laid_out_alike(planned.blocks, plan.parameters, plan.modules):
        planned = whole  # a layer laid out unlike the others: tying cannot express it
    return planned, accepted


def score_problem(problem: Problem, plan: Plan, time_limit_s: float | None = None, fingerprints=None) -> Score:
    """Score ``plan`` on a prepared problem (the model traced once, many plans scored).

    ``fingerprints``: the model fingerprints to accept (default: the problem's).
    """
    _check_model(problem.trace, plan, fingerprints or {problem.trace.fingerprint})
    if tuple(problem.choices.mesh_shape) != tuple(plan.mesh_shape):
        _check_mesh(plan, problem.choices.mesh_shape)
    if problem.blocks is not None and not laid_out_alike(problem.blocks, plan.parameters, plan.modules):
        raise PlanError(
            f"the plan lays out the layers of {problem.blocks.fqn} differently, and the problem plans them as one",
            hint="prepare the problem with tie=False, or score with autoplan.score",
        )
    pins, values, boundaries = pins_for_plan(problem, plan)
    skipped = tuple(pins.conflicts)
    warnings = [f"module boundary not pinned: {what}" for what in skipped]
    scored, _, fits = solve_problem(problem, pins, time_limit_s, warnings, over_budget=True,
                                    recompute=problem.recompute_mode(plan))
    p = scored.predicted
    return Score(
        step_time_s=p.step_time_s,
        compute_s=p.compute_s,
        comm_s=p.comm_s,
        peak_memory_bytes=p.peak_memory_bytes,
        model_state_bytes=p.model_state_bytes,
        activation_bytes=p.activation_bytes,
        fits=fits,
        budget_bytes=problem.budget_bytes,
        budget=problem.budget,
        profile=problem.profile.name,
        pinned_values=values,
        pinned_boundaries=boundaries,
        skipped_boundaries=skipped,
        plan=scored,
    )


def pins_for_plan(problem: Problem, plan: Plan) -> tuple[Pins, int, int]:
    """What a plan fixes: its parameter, batch and module boundary layouts, as pins
    (with the number of values and of boundaries pinned); the solver places the rest."""
    pins = Pins(problem)
    values = 0
    for fqn, spec in sorted(plan.parameters.items()):
        pins.place(fqn, spec, f"parameter {fqn}")
        values += 1
    for key, batch in sorted(plan.inputs.items()):
        pins.place(key, batch.placements, f"batch input {readable_path(key)}")
        values += 1
    boundaries, _ = pins.module_boundaries(plan.modules)
    return pins, values, boundaries


def plan_profile(plan: Plan, profile) -> ClusterProfile:
    """The profile to price ``plan`` with: ``profile`` (a name, a path or a ClusterProfile), else the one the plan was made with."""
    if isinstance(profile, ClusterProfile):
        return profile
    if profile is not None:
        return load_profile(profile)
    try:
        return load_profile(plan.profile)
    except ProfileError as err:
        raise ProfileError(
            f"the plan was made with profile {plan.profile!r}, which is not a built-in profile",
            hint="pass the profile to score with (--profile NAME|FILE)",
        ) from err


def _check_mesh(plan: Plan, mesh) -> None:
    if mesh is not None and tuple(int(n) for n in mesh) != tuple(plan.mesh_shape):
        raise PlanError(
            f"the plan is for a {'x'.join(map(str, plan.mesh_shape))} mesh, got {'x'.join(map(str, mesh))}",
            hint="score the plan on its own mesh, or re-plan for this mesh with `autoplan suggest --mesh`",
        )


def _check_model(trace: ModelTrace, plan: Plan, accepted: set[str], command: str = "score") -> None:
    traced = trace.traced
    names = trace.parameter_names()
    unknown = sorted(set(plan.parameters) - names)
    missing = sorted(names - set(plan.parameters))
    if unknown or missing:
        what = f"plan parameters not in the model: {unknown[:3]}" if unknown else f"model parameters missing from the plan: {missing[:3]}"
        raise PlanError(f"the plan does not match the model ({what})",
                        hint=f"{command} the model the plan was made for, or re-plan it with `autoplan suggest`")
    keys = set(traced.inputs.values())
    if set(plan.inputs) != keys:
        raise PlanError(
            f"the plan's batch inputs {_readable(plan.inputs)} are not the model's {_readable(keys)}",
            hint="pass the example inputs the plan was made with",
        )
    for node, key in traced.inputs.items():
        shape = _shape(traced, node)
        if tuple(plan.inputs[key].shape) != shape:
            raise PlanError(
                f"batch input {readable_path(key)} has shape {list(shape)}, the plan was made for {list(plan.inputs[key].shape)}",
                hint=f"{command} with the batch shape the plan was made for, or re-plan with `autoplan suggest`",
            )
    if plan.fingerprint not in accepted:
        raise PlanError(
            f"the plan's model fingerprint {plan.fingerprint} is not this model's ({trace.fingerprint}): "
            "it was made for another model, another version of it, or another autoplan",
            hint=f"{command} the model file and builder the plan was made for, or re-plan it with `autoplan suggest`",
        )
    stray = sorted(set(plan.modules) - trace.module_names())
    if stray:
        raise PlanError(f"plan modules not in the model: {stray[:3]}", hint="re-plan this model with `autoplan suggest`")


def _readable(keys) -> str:
    return "[" + ", ".join(readable_path(key) for key in sorted(keys)) + "]"


def _shape(traced, node: str) -> tuple[int, ...]:
    for fx_node in traced.graph_module.graph.nodes:
        if fx_node.name == node:
            return tuple(fx_node.meta["val"].shape)
    raise AssertionError(f"no placeholder {node}")
