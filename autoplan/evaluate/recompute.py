"""A plan's collectives predicted again for the modules it recomputes (``Plan.recompute``).

A plan's ``predicted`` tables are made when the plan is built, for the recompute set it was
built with. A set written in by hand (or changed) leaves them stale, as would any other hand
edit; and the repeats depend on where in each module's call the collectives run relative
to its last saved tensor (``plan/recompute.py``), which the module-level tables do not say.
So the prediction is made again from the model: the plan's layout scored (every parameter,
batch input and module boundary pinned, as ``autoplan score`` does), and its collectives
counted with the recompute set. ``autoplan verify`` does this for a plan that recomputes.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from autoplan.evaluate.score import _profile, check_plan_for_model, pins_for_plan
from autoplan.pipeline.problem import prepare_problem, solve_problem
from autoplan.plan.collectives import module_table, step_collectives
from autoplan.plan.module_plan import Plan, total_table


def with_recompute_prediction(model: nn.Module, example_inputs, plan: Plan, loss_fn=None) -> Plan:
    """``plan`` with ``predicted.module_collectives`` and ``predicted.collectives`` counted
    for its layout on ``model`` with its ``recompute`` set (every layer traced: no tying)."""
    check_plan_for_model(model, example_inputs, plan, loss_fn)
    problem = prepare_problem(
        model, example_inputs, plan.mesh_shape, plan.axis_names, _profile(plan, None), tie=False, loss_fn=loss_fn
    )
    pins, _, _ = pins_for_plan(problem, plan)
    _, solution, _ = solve_problem(problem, pins, over_budget=True)
    found = step_collectives(problem.costed, problem.expand(solution.choice), plan.modules, plan.recompute)
    modules = module_table(found, plan.axis_names)
    return replace(plan, predicted=replace(plan.predicted, module_collectives=modules, collectives=total_table(modules)))
