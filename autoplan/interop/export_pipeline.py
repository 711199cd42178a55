"""The pipeline part of ``autoplan export --format torch``: what torchtitan's config needs.

torchtitan's ``[parallelism]`` section (``torchtitan/config/job_config.py``) says how a model
is cut into pipeline stages: ``pipeline_parallel_degree`` (ranks on the pipeline axis),
``pipeline_parallel_schedule`` (a ``torch.distributed.pipelining`` schedule name),
``pipeline_parallel_microbatch_size`` (rows per microbatch on one data-parallel rank: its
local batch over the microbatches) and ``module_fqns_per_model_part`` (each stage's module
FQNs, in model order). ``pipeline_parallel_split_points`` (the module each stage after the
first starts with) is written too, for torchtitan versions before the FQN lists; newer ones
refuse it beside them, so it is kept apart. FQNs are the model's own: a torchtitan model
names its modules otherwise than a HuggingFace one.
"""

from __future__ import annotations

import math

from autoplan.placements import shard_dim
from autoplan.plan.module_plan import Plan


def torchtitan_pipeline(plan: Plan) -> dict:
    """torchtitan's ``[parallelism]`` settings for ``plan``'s pipeline (it must have one)."""
    pipeline = plan.pipeline
    assert pipeline is not None
    return {
        "pipeline_parallel_degree": pipeline.size,
        "pipeline_parallel_schedule": pipeline.schedule,
        "pipeline_parallel_microbatch_size": microbatch_rows(plan),
        "module_fqns_per_model_part": [list(stage.modules) for stage in pipeline.stages],
    }


def split_points(plan: Plan) -> list[str]:
    """The module each stage after the first starts with (torchtitan's older split points)."""
    assert plan.pipeline is not None
    return [stage.modules[0] for stage in plan.pipeline.stages[1:]]


def microbatch_rows(plan: Plan) -> int:
    """Rows of one microbatch on one rank: the batch (dim 0 of the plan's inputs) over the
    microbatches and over the mesh axes that split it."""
    assert plan.pipeline is not None
    rows, split = 0, 1
    for batch_input in plan.inputs.values():
        if not batch_input.shape:
            continue
        rows = max(rows, batch_input.shape[0])
        split = max(split, math.prod(size for size, p in zip(plan.mesh_shape, batch_input.placements) if shard_dim(p) == 0))
    return max(1, rows // plan.pipeline.microbatches // split)


def pipeline_source(plan: Plan) -> list[str]:
    """The generated module's lines for the pipeline (none without one)."""
    if plan.pipeline is None:
        return []
    full_shape, full_names = plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    settings = torchtitan_pipeline(plan)
    lines = [
        f"PP_AXIS = {plan.pipeline.axis!r}",
        f"FULL_MESH_SHAPE = {full_shape!r}",
        f"FULL_AXIS_NAMES = {full_names!r}",
        '"""The whole mesh; parallelize() takes one stage\'s mesh: device_mesh[AXIS_NAMES] of it."""',
        "",
        "TORCHTITAN_PARALLELISM = {",
    ]
    for key, value in settings.items():
        lines.append(f"    {key!r}: {value!r},")
    lines += [
        "}",
        '"""torchtitan\'s [parallelism] settings for the plan\'s stages (module FQNs are this model\'s own)."""',
        f"PIPELINE_SPLIT_POINTS = {split_points(plan)!r}",
        '"""The module each stage after the first starts with: pipeline_parallel_split_points, for torchtitan',
        'versions before module_fqns_per_model_part (newer ones refuse both together)."""',
        "",
    ]
    return lines
