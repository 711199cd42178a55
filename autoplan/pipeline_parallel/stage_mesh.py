"""One stage mesh planned: its layout solved for a pipeline stage, then priced as a pipeline.

The layout every stage runs is solved once, on the stage mesh (the full mesh less the
pipeline axis), by the tied planning problem (``pipeline/problem.py``) seen as a stage of
a pipeline of ``m = 4 pp`` microbatches runs it (``TYPICAL_MICROBATCHES_PER_STAGE``):
memory ``1 / pp`` of the model's parameters and optimizer state and the activations of
one microbatch through the whole model (1F1B keeps ``pp - i`` microbatches of ``1 / pp`` of
the blocks on stage ``i``: stage 0 holds about one microbatch's worth of the whole
model); time with what each microbatch pays again paid ``m`` times (a weight gathered
FSDP-style for every microbatch costs ``m`` gathers, which makes such storage dear).
That layout is then split into parts (``parts.py``) and every schedule, microbatch count
and stage split priced on it (``search.py``). The ILP prices its candidates by its cost
model alone here (no dry run of each candidate's step: a search over many meshes stays
fast), as ``autoplan.suggest`` does where a process group runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from autoplan.cost.edges import EdgeCost
from autoplan.cost.estimate import CostedGraph, compute_part_rows
from autoplan.errors import OptionError
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import ModelTrace, Problem, prepare_problem, solve_problem
from autoplan.pipeline_parallel.microbatch_collectives import layout_collectives, microbatch_of
from autoplan.pipeline_parallel.parts import (
    FIXED_PARTS,
    OPTIMIZER_PART,
    LayoutParts,
    batch_free,
    forward_seconds,
    layout_parts,
    named_parts,
)
from autoplan.pipeline_parallel.search import PipelineOption, PricingInputs, best_option, pricing_inputs
from autoplan.placements import is_shard, shard_dim
from autoplan.plan.module_plan import Plan
from autoplan.solve.ilp import Solution

TYPICAL_MICROBATCHES_PER_STAGE = 4
"""Microbatches per stage the layout is solved for (the search then prices every count)."""


@dataclass(frozen=True)
class StageMeshResult:
    """One full mesh planned with a pipeline axis (``pp`` 1: none)."""

    full_mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    axis_index: int
    layout: Plan
    """The layout every stage runs (the ILP's plan of the whole model on the stage mesh)."""
    parts: LayoutParts
    named: dict[str, str]
    """Parameter and buffer FQNs outside the stack -> "pre" or "post"."""
    best: PipelineOption | None
    options: tuple[PipelineOption, ...]
    seconds: float
    """Planning time of this mesh (the shared trace not included)."""
    problem: Problem | None = None
    solution: Solution | None = None
    """The stage mesh's problem (its ``step`` the model and whole batch) and the layout's
    solution: what the chosen mesh's collectives are predicted from (``microbatch_collectives.py``)."""

    plan_axis_index: int | None = None
    """Where the pipeline axis sits among the plan's own axes (the stage mesh's, less any of
    size 1); None: at ``axis_index``."""

    @property
    def size(self) -> int:
        return self.full_mesh[self.axis_index]


def plan_stage_mesh(model, batch, trace: ModelTrace, full_mesh: tuple[int, ...], axis_names: tuple[str, ...],
                    axis_index: int, cluster, budget, *, loss_fn=None, regime: str = "none",
                    time_limit_s: float | None = None, progress=None, max_virtual: int = 4) -> StageMeshResult:
    """The layout for ``full_mesh`` less its axis ``axis_index`` and the best pipeline on it."""
    start = time.perf_counter()
    size = full_mesh[axis_index]
    # Axes of size 1 split nothing; kept, two of them would let the ILP stack shards of one
    # piece (a strided shard over a size-1 axis), which no plan may hold.
    kept = [i for i, n in enumerate(full_mesh) if i != axis_index and n > 1]
    stage_mesh, stage_names = tuple(full_mesh[i] for i in kept), tuple(axis_names[i] for i in kept)
    plan_axis_index = sum(1 for i in kept if i < axis_index)
    if not stage_mesh:  # a pipeline alone: the stage mesh is one device
        stage_mesh, stage_names, plan_axis_index = (1,), ("dp",), 0
    if trace.blocks is None:
        raise OptionError("a pipeline axis needs a stack of identical blocks to cut into stages, and the model has "
                        "none (an nn.ModuleList of 3 or more alike layers); plan it without a pp axis")
    sequences = batch_sequences(batch)
    problem = prepare_problem(model, batch, stage_mesh, stage_names, cluster, budget=budget, trace=trace,
                              loss_fn=loss_fn, regime=regime, progress=progress)
    if problem.blocks is None:
        raise OptionError("a pipeline axis needs the repeated blocks planned alike, and the model's two traced blocks "
                        "differ; plan it without a pp axis")
    whole = problem
    problem = replace(problem, step=None)
    layout, solution, parts, inputs = solve_stage_layout(problem, sequences, full_mesh, axis_index, Pins, time_limit_s,
                                                         progress)
    options: list[PipelineOption] = []
    best = best_option(parts, inputs, size, max_virtual, options)
    return StageMeshResult(full_mesh, axis_names, axis_index, layout, parts, named_parts(problem), best,
                           tuple(options), time.perf_counter() - start, whole, solution, plan_axis_index)


class StageLayout(NamedTuple):
    layout: Plan
    solution: Solution
    parts: LayoutParts
    """The layout's price split where a pipeline cuts it (``parts.py``)."""
    inputs: PricingInputs
    """The batch, budget and pipeline link the candidates are priced with (``search.py``)."""


def solve_stage_layout(problem: Problem, sequences: int, full_mesh: tuple[int, ...], axis_index: int,
                       pins: Callable[[Problem], Pins], time_limit_s: float | None = None, progress=None) -> StageLayout:
    """The layout of a stage of a pipeline over ``full_mesh``'s axis ``axis_index`` solved on
    ``problem`` (the stage mesh's, its ``step`` None: priced by the cost model alone), seen as
    the module docstring says, and split into parts to price candidates on; ``pins(proxy)``
    the layouts already fixed (none when planning, a plan's own when scoring it)."""
    size = full_mesh[axis_index]
    choices = problem.choices
    microbatches = _typical_microbatches(sequences, _batch_ranks(choices.mesh_shape, choices.axis_names), size)
    seen = stage_memory(problem.reduced, 1.0 / size, 1.0 / microbatches)
    proxy = replace(problem, reduced=repeated_per_microbatch(seen, microbatches, batch_free(choices.graph)))
    # no collective tables: the plan made of this layout takes its stages' from a dry run
    # (``predicted_tables``), a score none
    layout, solution, _ = solve_problem(proxy, pins(proxy), time_limit_s, recompute=True, over_budget=True,
                                        progress=progress, tables=False)
    inputs = pricing_inputs(problem.profile, full_mesh, axis_index, sequences, batch_split(layout), problem.budget_bytes,
                            float(layout.predicted.memory.get("temporaries", 0)))
    return StageLayout(layout, solution, layout_parts(problem, solution, sequences), inputs)


def predicted_tables(result: StageMeshResult, option: PipelineOption, recompute: dict[str, str]) -> tuple[dict, dict]:
    """(module_collectives, collectives) of ``result``'s layout for one of ``option``'s
    microbatches, with the stages' checkpointing ``recompute`` (block FQN -> mode)."""
    problem, solution = result.problem, result.solution
    assert problem is not None and problem.step is not None and problem.blocks is not None and solution is not None
    step = problem.step
    micro = microbatch_of(step.batch, batch_sequences(step.batch), option.microbatches)
    return layout_collectives(problem, solution, replace(step, batch=micro), recompute, problem.blocks)


def batch_sequences(batch) -> int:
    """The batch's dim 0: the largest among its tensors (what microbatches divide)."""
    from torch.utils._pytree import tree_leaves

    sizes = [leaf.shape[0] for leaf in tree_leaves(batch) if hasattr(leaf, "shape") and len(leaf.shape) > 0]
    if not sizes:
        raise OptionError("a pipeline cuts the batch into microbatches along dim 0, and the batch has no tensor with a dim")
    return int(max(sizes))


def batch_split(layout: Plan) -> int:
    """How many pieces the layout cuts the batch's dim 0 into (a microbatch must divide by it)."""
    split = 1
    for batch_input in layout.inputs.values():
        pieces = math.prod(size for size, p in zip(layout.mesh_shape, batch_input.placements)
                           if is_shard(p) and shard_dim(p) == 0)
        split = max(split, pieces)
    return split


def _typical_microbatches(sequences: int, ranks: int, size: int) -> int:
    """The microbatch count the layout is solved for: ``TYPICAL_MICROBATCHES_PER_STAGE`` per stage,
    at most one sequence per rank the batch is split over (one stage: gradient accumulation)."""
    return max(1, min(TYPICAL_MICROBATCHES_PER_STAGE * size, sequences // max(1, ranks)))


def _batch_ranks(stage_mesh, stage_names) -> int:
    """The ranks a microbatch of the smallest size is spread over: every axis but tensor parallel's."""
    return math.prod(size for size, name in zip(stage_mesh, stage_names) if name != "tp") or 1


def repeated_per_microbatch(costed: CostedGraph, microbatches: int, free: dict[str, bool]) -> CostedGraph:
    """``costed`` with what each microbatch pays again (``parts.py``) paid ``microbatches`` times:
    fixed per-op costs, work on weights, a weight's move to its compute layout (an FSDP
    gather); what scales with tokens is the whole batch's already, what a step pays once stays."""
    if microbatches == 1:
        return costed
    extra = microbatches - 1
    nodes = {}
    for name, c in costed.nodes.items():
        rows = compute_part_rows(c)
        optimizer = rows[OPTIMIZER_PART]
        if free.get(name, False):
            repeated = tuple(t - o for t, o in zip(c.compute_s, optimizer))
        else:
            repeated = tuple(sum(rows[i][k] for i in FIXED_PARTS) for k in range(len(c.compute_s)))
        nodes[name] = replace(c, compute_s=tuple(t + extra * r for t, r in zip(c.compute_s, repeated)))
    edges = {}
    graph = costed.choices.graph
    for key, e in costed.edges.items():
        if free.get(key[0], False):
            carries = graph.decision(key[0]).requires_grad
            seconds = tuple(tuple(t + extra * forward_seconds(e, r, c, carries) for c, t in enumerate(row))
                            for r, row in enumerate(e.seconds))
            e = replace(e, seconds=seconds)
        edges[key] = e
    return CostedGraph(costed.choices, costed.profile, nodes, edges, costed.regime)


def stage_memory(costed: CostedGraph, state: float, activations: float) -> CostedGraph:
    """``costed`` with its model state (parameters, gradients, optimizer) times ``state`` and its
    activations times ``activations``: the memory the ILP weighs, as one stage holds it."""
    nodes = {}
    for name, c in costed.nodes.items():
        w = state if c.memory_kind == "model_state" else activations
        recompute = tuple(tuple(x * (activations if i % 2 else 1.0) for x in row) for i, row in enumerate(c.recompute))
        nodes[name] = replace(c, memory_bytes=_times(c.memory_bytes, w), end_bytes=_times(c.end_bytes, w),
                              forward_bytes=_times(c.forward_bytes, w), recompute=recompute)
    edges = {key: _edge(e, activations) for key, e in costed.edges.items()}
    return CostedGraph(costed.choices, costed.profile, nodes, edges, costed.regime)


def _times(row: tuple[float, ...], w: float) -> tuple[float, ...]:
    return tuple(w * x for x in row)


def _edge(e: EdgeCost, w: float) -> EdgeCost:
    def grid(g):
        return tuple(tuple(w * x for x in row) for row in g) if g else g
    return replace(e, kept_bytes=grid(e.kept_bytes), forward_bytes=grid(e.forward_bytes))

