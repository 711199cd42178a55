"""What one step of a pipelined plan sends between stages, and what it really sends.

Per microbatch, every boundary between consecutive stages held by different pipeline
ranks carries the activation forward and its gradient back: one ``send`` on the earlier
stage's rank and one ``recv`` on the later's, then the other way. Boundaries between two
stages of one rank (interleaved schedules place none; the V of ZBV places one) move
nothing. Counts are on the pipeline axis, per rank.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.device_mesh import DeviceMesh

from autoplan.plan.pipeline_plan import PipelinePlan
from autoplan.verify.observe import CollectiveCounter

P2P_KINDS = ("send", "recv")
"""The kinds of a pipeline's point-to-point traffic in collective tables, on the pipeline axis."""


def expected_p2p(pipeline: PipelinePlan, pp_rank: int) -> dict[str, int]:
    """``{"send": n, "recv": n}`` of one step on the ranks at ``pp_rank`` on the pipeline axis."""
    crossings = 0
    for before, after in zip(pipeline.stages, pipeline.stages[1:]):
        if before.rank != after.rank and pp_rank in (before.rank, after.rank):
            crossings += 1  # the activation one way, its gradient the other: one send and one recv each
    return {"send": crossings * pipeline.microbatches, "recv": crossings * pipeline.microbatches}


def counted_step(pipelined, mesh: DeviceMesh, batch) -> tuple[torch.Tensor | None, dict]:
    """Run ``pipelined.step(batch)`` counting every collective and point-to-point op:
    (its loss, the table module -> axis -> kind -> {"count", "bytes"})."""
    with CollectiveCounter(pipelined.modules, mesh) as counter:
        loss = pipelined.step(batch)
    return loss, counter.table()


def p2p_counts(table: dict, axis: str) -> dict[str, int]:
    """The sends and receives on ``axis`` in a counted table, over all modules."""
    counts = dict.fromkeys(P2P_KINDS, 0)
    for per_axis in table.values():
        for kind, entry in per_axis.get(axis, {}).items():
            if kind in counts:
                counts[kind] += entry["count"]
    return counts


def predicted_counts(plan, pp_rank: int) -> dict:
    """How many collectives and point-to-point ops one step runs on a rank at ``pp_rank``, as
    the plan predicts them (module -> axis -> kind -> {"count", "bytes": 0}): each module of
    the rank's stages runs its collectives of the layout's prediction
    (``predicted.module_collectives``, for one pass of the batch) once per microbatch, the
    loss's (at "<root>") on the last stage; the stage boundaries add ``expected_p2p`` at
    "<root>" on the pipeline axis. Bytes are left out: a microbatch moves its share of each
    activation, but a gradient reduction moves the whole gradient every time."""
    pipeline = plan.pipeline
    own = [m for i in pipeline.stages_of(pp_rank) for m in pipeline.stages[i].modules]
    last = len(pipeline.stages) - 1 in pipeline.stages_of(pp_rank)
    table: dict = {}

    def add(module: str, axis: str, kind: str, count: int) -> None:
        entry = table.setdefault(module, {}).setdefault(axis, {}).setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += count

    for module, per_axis in plan.predicted.module_collectives.items():
        per_axis = {axis: kinds for axis, kinds in per_axis.items() if axis != pipeline.axis}  # the planner's p2p: below
        held = last if module == "<root>" else any(module == m or module.startswith(m + ".") for m in own)
        if not held:
            continue
        for axis, per_kind in per_axis.items():
            for kind, entry in per_kind.items():
                add(module, axis, kind, entry["count"] * pipeline.microbatches)
    for kind, count in expected_p2p(pipeline, pp_rank).items():
        if count:
            add("<root>", pipeline.axis, kind, count)
    return table


def without_bytes(table: dict) -> dict:
    """``table`` with its counts alone (bytes 0), for ``verify.step_check.compare``."""
    return {module: {axis: {kind: {"count": entry["count"], "bytes": 0} for kind, entry in per_kind.items()}
                     for axis, per_kind in per_axis.items()} for module, per_axis in table.items()}


def pipeline_rank_of(plan, rank: int) -> int:
    """The pipeline-axis index of global ``rank`` on the plan's full mesh (ranks in row-major order)."""
    shape, _ = plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    index = plan.pipeline.axis_index
    return rank // math.prod(shape[index + 1:]) % shape[index]


def planner_p2p_problems(plan, counts: list[dict]) -> list[str]:
    """Where the plan's own prediction names the pipeline's traffic (``predicted.collectives``
    on the pipeline axis, kinds ``P2P_KINDS``: the count of one step over one pipeline, all
    its ranks together), how it differs from what ran on the pipeline holding global rank 0;
    [] where it agrees or predicts none."""
    pipeline = plan.pipeline
    predicted = plan.predicted.collectives.get(pipeline.axis, {})
    ranks = [rank for rank in range(len(counts)) if _same_stage_position(plan, rank)]
    problems = []
    for kind in P2P_KINDS:
        if kind not in predicted:
            continue
        ran = sum(p2p_counts(counts[rank], pipeline.axis)[kind] for rank in ranks)
        if predicted[kind]["count"] != ran:
            problems.append(f"{kind} on {pipeline.axis}: {predicted[kind]['count']} predicted per pipeline, {ran} ran")
    return problems


def _same_stage_position(plan, rank: int) -> bool:
    """Whether ``rank`` sits where global rank 0 does on every axis but the pipeline's."""
    shape, _ = plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    coordinate = []
    for size in reversed(shape):
        coordinate.append(rank % size)
        rank //= size
    coordinate.reverse()
    return all(c == 0 for axis, c in enumerate(coordinate) if axis != plan.pipeline.axis_index)


def predicted_counts_on_cpu(plan, pp_rank: int) -> dict:
    """``predicted_counts`` as gloo processes run them, on a CPU mesh: DTensor runs each of
    the plan's all_to_alls there as an all_gather (``step_check.as_on_cpu``)."""
    from autoplan.verify.step_check import as_on_cpu

    shape, names = plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    return as_on_cpu(predicted_counts(plan, pp_rank), dict(zip(names, shape)))
