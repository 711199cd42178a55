"""Expert parallel or not: which planning of the experts ``suggest --expert-parallel`` keeps.

``suggest(..., expert_parallel=True)`` on a model with routed experts modules
(``trace/experts.py``; HuggingFace's) plans it twice and keeps the cheaper step that fits
the memory budget (``keep_expert_choice``):

- as always, the experts traced as their own ops (their weights laid out as DTensor's
  strategies for those ops allow: whole, or split by rows or columns of each matrix);
- with each experts module traced as one region whose layout is a decision of the ILP
  (``choices/expert_layouts.py``): split over a mesh axis whose size divides ``E`` (expert
  parallel, the token exchange priced as ``all_to_all``s, the router's load even), the
  rows split or whole on the other axes and the weights' storage free (split further, as
  FSDP, where that fits better), or whole on every rank. Every other layout of the model
  is solved with it, and its plan is priced by a dry run of its step, as any plan.

Either may find no plan within the budget; the other is kept then. The plan kept says
what the other costs in a warning line that ``show`` and ``explain`` print (``EXPERT_NOTE``).

A model whose experts are only **grouped** (torchtitan's ``GroupedExperts``, called with
rows sorted by expert by a parent that sorts and weights) is priced the older way
(``choose_expert_layout``): the solved plan against the same plan with its experts split
over each mesh axis that divides them (``plan/expert_parallel.with_expert_parallel``), the
cheaper kept. Each candidate is priced as a plan's step always is (``repricing.py``):

- **communication**: its step itself, run on fake tensors on a fake process group
  (``verify/dry_run.py``), every collective counted (the count exchange, dispatch and
  combine ``all_to_all``s and their backward, the experts' gradient reductions over the
  token-split axes only) and priced by ``cost/comm.py``. The tokens' routing is data, so
  the dry run takes the router's load as even (``apply/token_exchange.dispatch``): each
  rank sends ``tokens x top_k x hidden x dtype bytes x (n-1)/n`` per exchange;
- **compute**: the solved plan's. Under an even load each rank runs its local ``E/n``
  experts on as many rows as its own tokens route, the experts' work of data
  parallelism; where the solved plan runs the experts whole on each rank (an opaque
  region), this over-counts the candidate's compute;
- **memory**: the solved plan's peak, with the expert weights, their gradients and AdamW
  moments at their expert-parallel size (the exchanged rows are not added).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from autoplan.cost.comm import table_seconds
from autoplan.errors import InfeasibleError
from autoplan.placements import local_shape
from autoplan.plan.expert_parallel import EXPERT_NOTE, with_expert_parallel
from autoplan.plan.module_plan import Plan, rounded, total_table
from autoplan.trace.experts import ROUTED, find_experts
from autoplan.units import ms
from autoplan.verify.dry_run import dry_run_collectives

Problem = Any
"""``pipeline/problem.Problem``."""

_STATE_COPIES = {"parameters": 1, "gradients": 1, "optimizer": 2}
"""Model state per parameter: itself, its gradient and AdamW's two moments."""


def has_routed_experts(model: nn.Module) -> bool:
    """Whether ``model`` has an experts module called routed (``trace/experts.py``): one the
    solver can lay out itself (``choices/expert_layouts.py``)."""
    return any(found.call == ROUTED for found in find_experts(model))


def keep_expert_choice(plain: Problem, regions: Problem, solved: Callable) -> tuple[Problem, tuple]:
    """``(problem, solved(problem))`` of the cheaper of two plannings that fits the budget:
    ``plain``, the experts traced as their ops (their weights laid out as DTensor's
    strategies for those ops allow), and ``regions``, each routed experts module one region
    the solver splits over a mesh axis or keeps whole (``choices/expert_layouts.py``).
    The plan kept says what the other costs in a warning line (``EXPERT_NOTE``). Raises the
    InfeasibleError of ``regions`` where neither fits."""
    try:
        theirs = solved(plain)
    except InfeasibleError:
        theirs = None  # no layout without expert parallel fits
    try:
        mine = solved(regions)
    except InfeasibleError:
        if theirs is None:
            raise
        mine = None
    if mine is None or (theirs is not None and theirs[0].predicted.step_time_s <= mine[0].predicted.step_time_s):
        assert theirs is not None
        other = ("split over an axis or whole, no plan fits the budget" if mine is None
                 else f"{_laid_out(mine[0])}: {ms(mine[0].predicted.step_time_s)} ms (slower)")
        return plain, (_noted(theirs[0], f"{EXPERT_NOTE} the experts keep the solved layout, step "
                                         f"{ms(theirs[0].predicted.step_time_s)} ms; {other}"), *theirs[1:])
    plan = mine[0]
    other = (f"their solved layout: {ms(theirs[0].predicted.step_time_s)} ms" if theirs is not None
             else "no layout of them as their own ops fits the budget")
    # The model's fingerprint is its trace's as planned without regions: what ``verify``, ``score`` and the
    # plan cache trace the model to check that a plan was made for it.
    plan = replace(plan, fingerprint=plain.trace.fingerprint)
    return regions, (_noted(plan, f"{EXPERT_NOTE} {_laid_out(plan)}, step {ms(plan.predicted.step_time_s)} ms; {other}"),
                     *mine[1:])


def _laid_out(plan: Plan) -> str:
    """How the regions' plan lays out the experts, in words."""
    split = sorted({layout["axis"] for layout in plan.expert_parallel.values()})
    return (f"{len(plan.expert_parallel)} experts module(s) split over {', '.join(split)}" if split
            else "the experts whole on every rank")


def choose_expert_layout(problem: Problem, plan: Plan, progress=None) -> Plan:
    """``plan`` or its cheapest expert-parallel form (see the module docstring)."""
    step = problem.step
    experts = find_experts(step.model) if step is not None else []
    if not experts or plan.pipeline is not None:
        return plan
    candidates = []
    for axis, size in zip(plan.axis_names, plan.mesh_shape):
        if size < 2 or any(found.experts % size for found in experts):
            continue
        if progress is not None:
            progress(f"pricing the experts split over {axis}")
        priced = _priced(problem, with_expert_parallel(plan, step.model, axis), plan, step.model)
        if priced is not None:
            candidates.append((axis, priced))
    if not candidates:
        return _noted(plan, f"{EXPERT_NOTE} no mesh axis divides the experts, or their step cannot run on fake "
                            "tensors; the experts keep the solved layout")
    axis, best = min(candidates, key=lambda item: item[1].predicted.step_time_s)
    fits = best.predicted.peak_memory_bytes <= problem.budget_bytes
    mine, theirs = best.predicted.step_time_s, plan.predicted.step_time_s
    if fits and mine < theirs:
        return _noted(best, f"{EXPERT_NOTE} {len(experts)} experts module(s) split over {axis}, step "
                            f"{ms(mine)} ms; their solved layout: {ms(theirs)} ms")
    why = "over the memory budget" if not fits else "slower"
    return _noted(plan, f"{EXPERT_NOTE} the experts keep the solved layout, step {ms(theirs)} ms; "
                        f"split over {axis}: {ms(mine)} ms ({why})")


def _priced(problem: Problem, candidate: Plan, solved: Plan, model: nn.Module) -> Plan | None:
    step = problem.step
    counted = dry_run_collectives(step.model, step.batch, candidate, step.loss_fn)
    if counted is None:
        return None
    p = solved.predicted
    comm = table_seconds(counted, problem.profile, candidate.mesh_shape, candidate.axis_names)
    step_s = rounded(p.compute_s + comm)
    memory = dict(p.memory)
    change = 0
    for part, copies in _STATE_COPIES.items():
        delta = copies * _expert_bytes_change(candidate, solved, model)
        if part in memory:
            memory[part] = int(memory[part] + delta)
        change += delta
    predicted = replace(p, step_time_s=step_s, comm_s=float(f"{step_s - p.compute_s:.12g}"),
                        module_collectives=counted, collectives=total_table(counted),
                        peak_memory_bytes=int(p.peak_memory_bytes + change),
                        model_state_bytes=int(p.model_state_bytes + change), memory=memory)
    solver = replace(candidate.solver, objective=step_s, bound=rounded(step_s * (1 - candidate.solver.gap)))
    return replace(candidate, predicted=predicted, solver=solver)


def _expert_bytes_change(candidate: Plan, solved: Plan, model: nn.Module) -> int:
    """Per device: the expert weights' bytes as ``candidate`` stores them less as ``solved`` does."""
    change = 0
    shapes = {fqn: tuple(p.shape) for fqn, p in model.named_parameters()}
    dtypes = {fqn: p.dtype for fqn, p in model.named_parameters()}
    for fqn in candidate.expert_parallel:
        for name, shape in shapes.items():
            if name.startswith(fqn + "."):
                size = torch.empty((), dtype=dtypes[name]).element_size()
                new = _numel(local_shape(shape, candidate.parameters[name], candidate.mesh_shape))
                old = _numel(local_shape(shape, solved.parameters[name], solved.mesh_shape))
                change += (new - old) * size
    return change


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _noted(plan: Plan, note: str) -> Plan:
    return replace(plan, warnings=(*plan.warnings, note))
