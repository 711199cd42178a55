"""One price for a step: a solution's plan priced by the collectives its step runs.

The ILP prices each move per edge and the backward by forward rules; the step DTensor runs
differs from that model where a value's readers share one move, gradients of several
readers are summed before one reduction, or DTensor picks another strategy than the plan
at run time. So the price a plan carries is made from its step itself:

    plan_of(problem, solution)      the solution's plan; where the problem holds the model
                                    and batch (``StepInputs``), its collectives are those a
                                    dry run of the applied plan counts (``verify/dry_run.py``:
                                    fake process group, fake tensors, the tied layers run once
                                    and widened), and its communication time theirs, priced by
                                    ``cost/comm.py``; compute is the cost stage's
    keep_cheapest(...)              the solver's choice re-priced: candidate plans (the ILP's
                                    optimum, then the optimum of plans with another layout of
                                    parameters and batch, a no-good cut per candidate) priced
                                    by their step, the cheapest kept; each candidate keeps the
                                    optimum's checkpointing (one solve each)

The ILP's error on the candidates priced so far bounds what another candidate can gain:
no search where it is within ``SEARCH_ABOVE`` of the first plan's step; the search stops
once the next candidate's ILP objective, less the largest error seen, is
no cheaper than the best price (with an ILP that prices the first plan exactly, no second
solve runs), and after ``MAX_CANDIDATES``. The plan's ``solver.objective``,
``predicted.step_time_s`` and its priced collectives are then one figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from autoplan.choices.graph import INPUT, PARAMETER
from autoplan.cost.comm import table_seconds
from autoplan.errors import InfeasibleError
from autoplan.plan.builder import Checkpointed, build_plan, predict
from autoplan.plan.expand import expand_plan
from autoplan.plan.module_plan import Plan, rounded, total_table
from autoplan.solve.ilp import Solution
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks
from autoplan.verify.dry_run import dry_run_collectives

Problem = Any
"""``pipeline/problem.Problem`` (not imported: it imports this module)."""

MAX_CANDIDATES = 2
"""Plans priced by their step per solve, the ILP's optimum included (each costs a solve and
two to four dry runs: a partly checkpointed 32-layer stack on 8x8 planned in 2.4x the CPU
time with a third)."""

SEARCH_ABOVE = 0.01
"""Other candidates are solved only where the ILP's price of its optimum is off its step's by
more than this share of the step: below it, no other layout can gain more than the ILP's
error, a fraction of the 2 % the one price is held to."""


@dataclass(frozen=True)
class StepInputs:
    """What a dry run of a plan's step needs: the model (real or on meta), one batch, the loss."""

    model: nn.Module
    batch: Any
    loss_fn: Callable | None = None


def plan_of(problem: Problem, solution: Solution, warnings: tuple[str, ...] = ()) -> Plan:
    """The whole model's plan of ``solution``, priced by its step where ``problem.step`` is
    given and the step runs on fake tensors, else by the cost stage and the rules of
    ``plan/collectives.py``. Its ``solver.objective`` is its step time."""
    return priced_plan(problem, solution, warnings)[0]


def priced_plan(problem: Problem, solution: Solution, warnings: tuple[str, ...] = (), tables: bool = True,
                ) -> tuple[Plan, bool]:
    """(``plan_of``'s plan, whether its price comes from a dry run of its step). Without
    ``tables``, a plan priced by the cost stage (``problem.step`` None) has no collective
    tables: the rules that make them cost as much as the solve, and a caller that reads only
    its price and memory (a pipeline's stage layouts, one per mesh shape) would drop them."""
    choice = problem.expand(solution.choice)
    checkpointed = _checkpointed(problem, solution)
    step = problem.step
    plan = build_plan(problem.costed, choice, solution, extra_warnings=warnings, checkpointed=checkpointed,
                      collectives=step is None and tables)
    if math.isfinite(problem.budget_bytes):
        plan = replace(plan, solver=replace(plan.solver, memory_budget_bytes=problem.budget_bytes))
    blocks = problem.blocks
    partly = checkpointed is not None and blocks is not None and KEPT_LAYERS <= checkpointed.layers < blocks.count
    counted = unchecked = None
    longer = longer_unchecked = None
    if step is not None:
        counted, longer = _counted(step, plan, blocks)
        if counted is not None and partly:
            # the traced layers are both checkpointed, later ones past the first k are not
            unchecked, longer_unchecked = _counted(step, replace(plan, recompute={}), blocks)
            counted = counted if unchecked is not None else None
    if counted is None:
        if step is not None:  # the step reads tensor values (or a process group runs here): the rules predict
            plan = replace(plan, predicted=predict(problem.costed, choice, plan.axis_names, plan.modules, checkpointed))
        if partly and (step is not None or tables):
            unchecked = predict(problem.costed, choice, plan.axis_names, plan.modules).module_collectives
    else:
        plan = replace(plan, predicted=replace(plan.predicted, module_collectives=counted, collectives=total_table(counted)))
    if blocks:
        plan = expand_plan(plan, blocks, checkpointed.layers if checkpointed else None, unchecked)
        if counted is not None and longer is not None:
            k = checkpointed.layers if checkpointed is not None else 0
            modules = _layers_as_run(plan.predicted.module_collectives, blocks, longer, longer_unchecked, k)
            plan = replace(plan, predicted=replace(plan.predicted, module_collectives=modules,
                                                   collectives=total_table(modules)))
    if counted is not None:
        plan = _priced_by_step(plan, problem)
    step_s = plan.predicted.step_time_s  # the objective; the bound keeps the solver's proved gap to it
    plan = replace(plan, solver=replace(plan.solver, objective=step_s, bound=rounded(step_s * (1 - plan.solver.gap))))
    return plan, counted is not None


def _layers_as_run(table: dict, blocks: RepeatedBlocks, longer: dict, longer_unchecked: dict | None, k: int) -> dict:
    """``table`` (widened) with each layer's rows those of its place in the three-layer run:
    the first layer's, a middle one's (layer 1) or the last one's (layer 2): the last layer
    hands its output to what follows the stack, which a middle one does not. A layer past
    the first ``k`` (checkpointed) takes the unchecked run's rows."""
    last = blocks.count - 1
    out = {m: rows for m, rows in table.items() if blocks.layer_of(m) is None}
    for index in range(blocks.count):
        run = longer if index < k or longer_unchecked is None else longer_unchecked
        source = 0 if index == 0 else 2 if index == last else 1
        for fqn, rows in run.items():
            if blocks.layer_of(fqn) == source:
                out[blocks.rename(fqn, index)] = rows
    return dict(sorted(out.items()))


def _counted(step: StepInputs, plan: Plan, blocks: RepeatedBlocks | None) -> tuple[dict | None, dict | None]:
    """The collectives of ``plan``'s step (``dry_run_collectives``). Tied (``blocks``): the
    cut model's table, its rows outside the layers made those of the whole stack. A layer's
    own rows are widened to every layer by ``expand_plan``; what a layer causes outside its
    modules (a gradient moved between two layers, counted where no layer's autograd node
    claims it) is not, so the step runs once more with one layer more, and each further
    layer adds that difference. Also returns that longer run's table (None untied)."""
    counted = dry_run_collectives(step.model, step.batch, plan, step.loss_fn, blocks)
    if counted is None or blocks is None:
        return counted, None
    wider = replace(blocks, count=KEPT_LAYERS + 1)
    longer = dry_run_collectives(step.model, step.batch, expand_plan(plan, wider), step.loss_fn, blocks, keep=KEPT_LAYERS + 1)
    if longer is None:
        return None, None
    outside = {m for m in set(counted) | set(longer) if blocks.layer_of(m) is None}
    more = blocks.count - KEPT_LAYERS
    table = {m: rows for m, rows in counted.items() if m not in outside}
    for module in sorted(outside):
        cut, one_more = _entries(counted.get(module, {})), _entries(longer.get(module, {}))
        for key in sorted(set(cut) | set(one_more)):
            base, next_ = cut.get(key, (0, 0)), one_more.get(key, (0, 0))
            count = max(0, base[0] + more * (next_[0] - base[0]))
            nbytes = max(0, base[1] + more * (next_[1] - base[1]))
            if count:
                axis, kind = key
                table.setdefault(module, {}).setdefault(axis, {})[kind] = {"count": count, "bytes": nbytes}
    return table, longer


def _entries(per_axis: dict) -> dict[tuple[str, str], tuple[int, int]]:
    return {(axis, kind): (e["count"], e["bytes"]) for axis, kinds in per_axis.items() for kind, e in kinds.items()}


def _priced_by_step(plan: Plan, problem: Problem) -> Plan:
    """``plan`` with its communication time that of its counted collectives."""
    p = plan.predicted
    comm = table_seconds(p.module_collectives, problem.profile, plan.mesh_shape, plan.axis_names)
    step_s = rounded(p.compute_s + comm)
    predicted = replace(p, step_time_s=step_s, comm_s=float(f"{step_s - p.compute_s:.12g}"))
    return replace(plan, predicted=predicted)


def keep_cheapest(
    problem: Problem, first: Solution, first_plan: Plan, solve_again: Callable[[tuple[dict[str, int], ...]], Solution],
    warnings: tuple[str, ...] = (), counted: bool = True, price: Callable | None = None,
) -> tuple[Plan, Solution, int]:
    """Of ``first`` (the ILP's optimum, whose plan ``first_plan`` was priced by its step where
    ``counted``) and the optima that lay out parameters and batch otherwise
    (``solve_again(excluded)``), the plan whose step is cheapest: (plan, its solution,
    candidates priced); ``price``: ``priced_plan`` or a wrapper of it (the caller's timing). See the
    module docstring for when it stops. Without a dry run of
    the step there is no other price than the ILP's, whose optimum ``first`` is."""
    if problem.step is None or not counted:
        return first_plan, first, 1
    layout = _layout_decisions(problem, first)
    best_plan, best = first_plan, first
    excluded = [{name: first.choice[name] for name in layout}]
    error = abs(first_plan.predicted.step_time_s - first.objective_s)
    priced = 1
    if error <= SEARCH_ABOVE * first_plan.predicted.step_time_s:
        return first_plan, first, priced
    while priced < MAX_CANDIDATES and layout:
        if first.objective_s - error >= best_plan.predicted.step_time_s:
            break  # no other plan's ILP price, less the error seen, is below the best
        try:
            found = solve_again(tuple(excluded))
        except InfeasibleError:
            break  # no other layout fits
        if found.objective_s - error >= best_plan.predicted.step_time_s:
            break
        plan, counted = (price or priced_plan)(problem, found, warnings)
        if not counted:
            break  # this layout's step reads tensor values: no price to compare it by
        priced += 1
        error = max(error, abs(plan.predicted.step_time_s - found.objective_s))
        excluded.append({name: found.choice[name] for name in layout})
        if plan.predicted.step_time_s < best_plan.predicted.step_time_s:
            best_plan, best = plan, found
    return best_plan, best, priced


def _layout_decisions(problem: Problem, solution: Solution) -> tuple[str, ...]:
    """The solver's decisions that lay out parameters and batch (what a candidate changes)."""
    graph = problem.choices.graph
    return tuple(
        name for name in solution.choice
        if name in graph and graph.decision(name).kind in (PARAMETER, INPUT)
        and len(problem.reduced.nodes[name].compute_s) > 1
    )


def _checkpointed(problem: Problem, solution: Solution) -> Checkpointed | None:
    """The solution's checkpointing in the terms of the whole traced graph, or None."""
    if solution.recompute is None:
        return None
    assert problem.layers is not None  # a solution checkpoints only the problem's layer stack
    layers, unit, k = problem.layers, problem.layers.unit, solution.recompute_layers
    return Checkpointed(solution.recompute, layers.decisions, layers.freed, unit.freed_share(k), unit.modules[:k],
                        rerun_share=unit.rerun_share(k), layers=k, inputs=layers.inputs)

