"""Score a plan whose step runs its batch in microbatches: pipeline stages, or gradient accumulation.

``evaluate/score.py`` prices one layout's step on the whole batch. A plan with pipeline
stages (``plan/pipeline_plan.py``), or a layout run as ``k`` microbatches of gradient
accumulation (a recipe's local batch reached with an accumulation count, as torchtitan's
``local_batch_size`` and ``global_batch_size`` do), is priced as the pipeline planner prices
its candidates (``pipeline_parallel/``), so that a plan scored and a plan suggested compare
on one price:

1. the model is traced tied and the layout's parameter, batch and module boundary layouts
   are pinned on the stage mesh (the plan's own mesh; for accumulation the whole mesh);
2. the rest of the layout is solved as a stage of the pipeline
   (``stage_mesh.solve_stage_layout``) and split into parts (``parts.py``);
3. the plan's own schedule, microbatches, split of the blocks into stages and checkpointed
   blocks are priced (``search.price_option`` with ``FixedStages``): bubble, sends on the
   pipeline axis's link, per-microbatch and per-step costs, each rank's peak.

For a plan ``suggest`` wrote with the same profile and budget, the score is the plan's own
prediction again. Gradient accumulation is one stage run ``k`` times: activations of one
microbatch held at a time, weight gradients reduced once per step.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from autoplan.errors import OptionError, PlanError
from autoplan.evaluate.score_base import Score, check_plan_for_model, pins_for_plan, plan_profile
from autoplan.pipeline.budget import plans_budget
from autoplan.pipeline.problem import prepare_problem
from autoplan.pipeline_parallel.assemble import outer_modules, pipelined_plan
from autoplan.pipeline_parallel.parts import named_parts
from autoplan.pipeline_parallel.schedules import ScheduleShape
from autoplan.pipeline_parallel.search import FixedStages, price_option
from autoplan.pipeline_parallel.stage_mesh import batch_sequences, batch_split, solve_stage_layout
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import PipelinePlan, Stage
from autoplan.tree_paths import fqn_within


def score_microbatched(model: nn.Module, example_inputs, plan: Plan, profile=None, memory_gb: float | None = None,
                       time_limit_s: float | None = None, loss_fn=None, progress=None, *,
                       memory_gib: float | None = None, microbatches: int | None = None,
                       mesh: tuple[int, ...] | None = None) -> Score:
    """Score a pipelined ``plan`` (its stages, schedule and microbatches as written), or a plan
    without stages run as ``microbatches`` steps of gradient accumulation; the arguments are
    ``evaluate.score.score``'s (``mesh``: the full mesh, pipeline axis included). ``Score.plan``
    is the plan re-priced (for accumulation: still without stages, its checkpointing as priced)."""
    if plan.pipeline is not None and microbatches not in (None, plan.pipeline.microbatches):
        raise OptionError(f"the plan runs its pipeline with {plan.pipeline.microbatches} microbatches; score it with "
                          "those (leave out --microbatches), or re-plan it for another count")
    count = plan.pipeline.microbatches if plan.pipeline is not None else microbatches
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise OptionError(f"microbatches must be a whole number >= 1, got {count!r}")
    pipeline = plan.pipeline or _one_stage(plan, count)
    full_mesh, _ = pipeline.full_mesh(tuple(plan.mesh_shape), tuple(plan.axis_names))
    if mesh is not None and tuple(int(n) for n in mesh) not in (full_mesh, tuple(plan.mesh_shape)):
        raise PlanError(f"the plan is for a {'x'.join(map(str, full_mesh))} mesh, got {'x'.join(map(str, mesh))}",
                        hint="score the plan on its own mesh, or re-plan for this mesh with `autoplan suggest`")
    cluster = plan_profile(plan, profile)
    if progress is not None:
        progress("tracing the model to check the plan against it")
    trace, _ = check_plan_for_model(model, example_inputs, plan, loss_fn)
    if trace.blocks is None:
        raise PlanError("scoring microbatches needs the model's stack of identical blocks planned alike (a pipeline "
                        "cuts it into stages; accumulation prices one block)", hint="score the plan without microbatches")
    sequences = batch_sequences(example_inputs)
    ranks = batch_split(plan)  # a microbatch must still split over them
    if sequences % (count * ranks):
        raise OptionError(f"the batch's {sequences} sequences do not split into {count} microbatches over the "
                          f"{ranks} ranks the plan splits the batch over; pick a count that divides {sequences // ranks}"
                          if sequences % ranks == 0 else
                          f"the batch's {sequences} sequences do not split over the plan's {ranks} batch ranks")
    problem = prepare_problem(model, example_inputs, plan.mesh_shape, plan.axis_names, cluster, memory_gb,
                              memory_gib=memory_gib, budget=plans_budget(plan), trace=trace, loss_fn=loss_fn,
                              progress=progress, regime=plan.regime)
    problem = replace(problem, step=None)  # priced by the cost model alone, as the pipeline planner prices
    if progress is not None:
        progress("solving the plan's cheapest execution as a pipeline stage")
    pinned: list = []  # (pins, boundaries pinned) of the stage problem, for the score's counts

    def pins(proxy):
        found, _, boundaries = pins_for_plan(proxy, plan)
        pinned.append((found, boundaries))
        return found

    layout, _, parts, inputs = solve_stage_layout(problem, sequences, full_mesh, pipeline.axis_index, pins, time_limit_s,
                                                  progress)
    blocks = trace.blocks
    fixed = _fixed_stages(plan, pipeline, blocks)
    shape = ScheduleShape(pipeline.schedule, pipeline.virtual)
    option = price_option(parts, inputs, pipeline.size, shape, count, fixed=fixed)
    if option is None:
        raise PlanError(f"the plan's {len(pipeline.stages)} stages do not hold the model's {blocks.count} blocks "
                        "as one run each", hint="re-plan it with `autoplan suggest`")
    names = [n for n, _ in model.named_parameters()]
    covers = outer_modules(names, named_parts(problem), blocks.fqn)
    alternatives = plan.pipeline.alternatives if plan.pipeline is not None else ()
    scored = pipelined_plan(layout, option, blocks, covers, pipeline.axis, pipeline.axis_index, alternatives)
    if plan.pipeline is None:  # accumulation: the plan stays one without stages
        scored = replace(scored, pipeline=None)
    p = scored.predicted
    values = len(plan.parameters) + len(plan.inputs)
    (found, boundaries), = pinned
    return Score(step_time_s=p.step_time_s, compute_s=p.compute_s, comm_s=p.comm_s,
                 peak_memory_bytes=p.peak_memory_bytes, model_state_bytes=p.model_state_bytes,
                 activation_bytes=p.activation_bytes, fits=option.fits, budget_bytes=problem.budget_bytes,
                 budget=problem.budget, profile=cluster.name, pinned_values=values,
                 pinned_boundaries=boundaries, skipped_boundaries=tuple(found.conflicts), plan=scored)


def _one_stage(plan: Plan, count: int) -> PipelinePlan:
    """Gradient accumulation as a pipeline of one rank and one stage holding the whole model."""
    return PipelinePlan("accumulation", 1, len(plan.mesh_shape), "1F1B", count, (Stage(("",), 0),))


def _fixed_stages(plan: Plan, pipeline: PipelinePlan, blocks) -> FixedStages:
    """Blocks per stage and each stage's checkpointed blocks, read from the plan."""
    counts, recompute = [], []
    for stage in pipeline.stages:
        layers = [i for i in range(blocks.count) if any(fqn_within(blocks.layer_prefix(i), m) for m in stage.modules)]
        counts.append(len(layers))
        modes = [plan.recompute[blocks.layer_prefix(i)] for i in layers if blocks.layer_prefix(i) in plan.recompute]
        if len(set(modes)) > 1:
            raise PlanError(f"a stage checkpoints its blocks in two modes ({', '.join(sorted(set(modes)))}), which the "
                            "pipeline price cannot say", hint="checkpoint one stage's blocks alike")
        recompute.append((modes[0] if modes else None, len(modes)))
    return FixedStages(tuple(counts), tuple(recompute))
