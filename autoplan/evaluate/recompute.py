"""A plan's collectives predicted again for the modules it recomputes (``Plan.recompute``).

A plan's ``predicted`` tables are made when the plan is built, for the recompute set it was
built with. A set written in by hand (or changed) leaves them stale, as would any other hand
edit; and the repeats depend on where in each module's call the collectives run relative
to its last saved tensor (``plan/recompute.py``), which the module-level tables do not say.
So the repeats are predicted again from the model: the plan's layout scored (every
parameter, batch input and module boundary pinned, as ``autoplan score`` does), its
collectives counted with and without the recompute set, and the difference added to the
plan's own tables. Only the difference: the layouts the pins leave to the solver may come
out otherwise than when the plan was made (``score`` solves without the plan's memory
budget), and the plan's own tables are what it was verified to run. Where the plan's
tables already count the set (a plan built with it), the layout scored reproduces them
with it, and nothing is added. ``autoplan verify`` does this for a plan that recomputes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from torch import nn

from autoplan.evaluate.score import check_plan_for_model, pins_for_plan, plan_profile
from autoplan.pipeline.problem import prepare_problem, solve_problem
from autoplan.plan.collectives import module_table, step_collectives
from autoplan.plan.module_plan import Plan, total_table


def with_recompute_prediction(model: nn.Module, example_inputs, plan: Plan, loss_fn=None, command: str = "verify") -> Plan:
    """``plan`` with ``predicted.module_collectives`` and ``predicted.collectives`` counting
    the repeats of its ``recompute`` set on ``model``. A set that checkpoints the first
    layers of the repeated stack alike (what ``suggest`` makes): the tables of the plan's
    layout scored with that set, counted on its step (``pipeline/repricing.py``), which for
    a plan built with the set are its own. Any other set: the repeats the rules of
    ``plan/collectives.py`` predict, added (every layer traced: no tying)."""
    trace, _ = check_plan_for_model(model, example_inputs, plan, loss_fn, command)
    if trace.blocks is not None:
        tied = prepare_problem(model, example_inputs, plan.mesh_shape, plan.axis_names, plan_profile(plan, None),
                               trace=trace, loss_fn=loss_fn)
        mode = tied.recompute_mode(plan)
        if mode:
            pins, _, _ = pins_for_plan(tied, plan)
            scored, _, _ = solve_problem(tied, pins, over_budget=True, recompute=mode)
            counted = scored.predicted.module_collectives
            return replace(plan, predicted=replace(plan.predicted, module_collectives=counted,
                                                   collectives=total_table(counted)))
    problem = prepare_problem(
        model, example_inputs, plan.mesh_shape, plan.axis_names, plan_profile(plan, None), tie=False, loss_fn=loss_fn,
        regime=plan.regime,
    )
    pins, _, _ = pins_for_plan(problem, plan)
    _, solution, _ = solve_problem(problem, pins, over_budget=True)
    choice = problem.expand(solution.choice)
    without = step_collectives(problem.costed, choice, plan.modules)
    with_recompute = step_collectives(problem.costed, choice, plan.modules, plan.recompute)
    stored = plan.predicted.module_collectives
    if module_table(with_recompute, plan.axis_names) == stored:
        return plan  # its tables already count the set
    modules = _added(stored, with_recompute - without, plan.axis_names)
    return replace(plan, predicted=replace(plan.predicted, module_collectives=modules, collectives=total_table(modules)))


def _added(table: dict, repeats: Counter, axis_names: tuple[str, ...]) -> dict:
    """``table`` (module -> axis -> kind -> {"count", "bytes"}) with ``step_collectives``' ``repeats`` added."""
    out = {m: {a: {k: dict(e) for k, e in kinds.items()} for a, kinds in axes.items()} for m, axes in table.items()}
    for (module, kind, axis, nbytes), count in repeats.items():
        entry = out.setdefault(module, {}).setdefault(axis_names[axis], {}).setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += count
        entry["bytes"] += count * nbytes
    return {m: {a: dict(sorted(kinds.items())) for a, kinds in sorted(axes.items())} for m, axes in sorted(out.items())}
