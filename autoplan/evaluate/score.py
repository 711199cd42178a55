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

from torch import nn

from autoplan.dtensor import context_attention
from autoplan.errors import PlanError
from autoplan.evaluate.score_base import (  # the shared parts, imported from here by callers too
    Score,
    check_mesh,
    check_model,
    check_plan_for_model,
    pins_for_plan,
    plan_profile,
)
from autoplan.pipeline.budget import plans_budget
from autoplan.pipeline.problem import Problem, prepare_problem, solve_problem
from autoplan.plan.module_plan import Plan
from autoplan.trace.repeats import laid_out_alike


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
    check_mesh(plan, mesh)
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


def score_problem(problem: Problem, plan: Plan, time_limit_s: float | None = None, fingerprints=None) -> Score:
    """Score ``plan`` on a prepared problem (the model traced once, many plans scored).

    ``fingerprints``: the model fingerprints to accept (default: the problem's).
    """
    check_model(problem.trace, plan, fingerprints or {problem.trace.fingerprint})
    if tuple(problem.choices.mesh_shape) != tuple(plan.mesh_shape):
        check_mesh(plan, problem.choices.mesh_shape)
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
