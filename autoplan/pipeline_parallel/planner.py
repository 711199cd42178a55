"""``suggest`` with a pipeline axis, and with the mesh shape chosen too.

    suggest_pipelined(model, batch, (4, 8, 4), ("pp", "dp", "tp"))   a given mesh whose "pp"
                                   axis is a pipeline axis: the layout on the stage mesh
                                   (dp, tp), the stages, schedule, microbatches and checkpointing
    suggest_devices(model, batch, 128, devices_per_node=8)           every (pp, dp, tp) of 128
                                   devices (``mesh_shapes.py``) planned so, the fastest that
                                   fits kept, the others reported

The model is traced once (tied: two blocks deep) and that trace serves every mesh; each
mesh builds its choices, costs and solves one ILP (``stage_mesh.py``). A mesh whose pp is
1 is priced the same way with one stage, its microbatches accumulating gradients, so the
shapes compare on one price; where it wins with one microbatch its plan is the plain layout
of that mesh, with more, a pipeline of one stage (torch's 1F1B schedule on one stage is
gradient accumulation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from autoplan.cost.regime import DEFAULT_REGIME, check_regime
from autoplan.errors import OptionError
from autoplan.pipeline.problem import resolve_options, trace_for_planning
from autoplan.pipeline_parallel.assemble import outer_modules, pipelined_plan
from autoplan.pipeline_parallel.mesh_shapes import mesh_shapes
from autoplan.pipeline_parallel.search import PipelineOption
from autoplan.pipeline_parallel.stage_mesh import StageMeshResult, batch_sequences, plan_stage_mesh, predicted_tables
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import Alternative

PIPELINE_AXIS = "pp"
"""The axis name that makes a mesh axis a pipeline axis."""


@dataclass(frozen=True)
class PipelineReport:
    """What a pipelined planning run priced: the chosen mesh's result, and every mesh's."""

    plan: Plan
    chosen: StageMeshResult
    meshes: tuple[StageMeshResult, ...]
    trace_s: float
    total_s: float
    skipped: tuple[str, ...] = field(default_factory=tuple)
    """Meshes not planned, with why."""

    def stats(self) -> dict:
        return {
            "trace_s": round(self.trace_s, 3), "total_s": round(self.total_s, 3),
            "meshes": [{"mesh": mesh_words(r), "step_time_s": r.best.step_s if r.best else None,
                        "fits": bool(r.best and r.best.fits), "planning_s": round(r.seconds, 3)} for r in self.meshes],
            "step_time_s": self.plan.predicted.step_time_s, "peak_memory_bytes": self.plan.predicted.peak_memory_bytes,
        }


def mesh_words(result: StageMeshResult) -> str:
    return " x ".join(f"{name} {size}" for name, size in zip(result.axis_names, result.full_mesh))


def suggest_pipelined(model, example_inputs, mesh, axis_names, profile=None, memory_gb: float | None = None, *,
                      memory_gib: float | None = None, pipeline_axis: str = PIPELINE_AXIS, loss_fn=None,
                      compile: str = DEFAULT_REGIME, time_limit_s: float | None = None, progress=None,
                      max_virtual: int = 4) -> tuple[Plan, PipelineReport]:
    """Plan ``model`` for ``mesh`` whose axis named ``pipeline_axis`` is a pipeline axis."""
    check_regime(compile)
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb, memory_gib)
    if pipeline_axis not in axis_names:
        raise OptionError(f"no mesh axis is named {pipeline_axis!r} (axis names {', '.join(axis_names)}): name the pipeline "
                        f"axis {pipeline_axis!r}, e.g. --axis-names {pipeline_axis},dp,tp")
    start = time.perf_counter()
    _progress(progress, "tracing the model")
    trace = trace_for_planning(model, example_inputs, True, loss_fn)
    trace_s = time.perf_counter() - start
    result = plan_stage_mesh(model, example_inputs, trace, mesh, axis_names, axis_names.index(pipeline_axis), cluster,
                             budget, loss_fn=loss_fn, regime=compile, time_limit_s=time_limit_s, progress=progress,
                             max_virtual=max_virtual)
    if result.best is None:
        raise OptionError(f"no pipeline of {result.size} stages prices for this model and batch (too few blocks, or no "
                        f"microbatch count: the batch's {batch_sequences(example_inputs)} sequences over the data-parallel "
                        "ranks must split into at least as many microbatches as stages); use a smaller pp axis")
    plan = _plan_of(model, trace.blocks, result, pipeline_axis, _stage_alternatives(result))
    return plan, PipelineReport(plan, result, (result,), trace_s, time.perf_counter() - start)


def suggest_devices(model, example_inputs, devices: int, devices_per_node: int | None = None, profile=None,
                    memory_gb: float | None = None, *, memory_gib: float | None = None, loss_fn=None,
                    compile: str = DEFAULT_REGIME, time_limit_s: float | None = None, progress=None,
                    max_virtual: int = 4, max_stages: int | None = None) -> tuple[Plan, PipelineReport]:
    """Plan ``model`` for ``devices`` devices, the mesh shape (pp, dp, tp) chosen too; the
    fastest plan that fits the budget (else the one closest to fitting)."""
    check_regime(compile)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise OptionError(f"devices must be a whole number >= 1, got {devices!r}")
    _, _, cluster, budget = resolve_options((devices,), ("dp",), profile, memory_gb, memory_gib)
    if devices_per_node is not None:
        if not isinstance(devices_per_node, int) or devices_per_node < 1:
            raise OptionError(f"devices_per_node must be a whole number >= 1, got {devices_per_node!r}")
        cluster = replace(cluster, devices_per_node=devices_per_node)
    start = time.perf_counter()
    _progress(progress, "tracing the model")
    trace = trace_for_planning(model, example_inputs, True, loss_fn)
    trace_s = time.perf_counter() - start
    blocks = trace.blocks.count if trace.blocks else 1
    sequences = batch_sequences(example_inputs)
    results, skipped = [], []
    for shape in mesh_shapes(devices, cluster.devices_per_node, min(blocks, max_stages or blocks)):
        if sequences % shape.dp:
            skipped.append(f"{shape.words()}: the batch's {sequences} sequences do not split over dp {shape.dp}")
            continue
        if shape.pp > 1 and trace.blocks is None:
            continue
        _progress(progress, f"planning {shape.words()}")
        try:
            results.append(plan_stage_mesh(model, example_inputs, trace, (shape.pp, shape.dp, shape.tp),
                                           (PIPELINE_AXIS, "dp", "tp"), 0, cluster, budget, loss_fn=loss_fn,
                                           regime=compile, time_limit_s=time_limit_s, progress=progress,
                                           max_virtual=max_virtual))
        except OptionError as error:
            skipped.append(f"{shape.words()}: {error}")
    priced = [(r, r.best) for r in results if r.best is not None]
    if not priced:
        raise OptionError(f"no mesh shape of {devices} devices could be planned ({'; '.join(skipped) or 'none tried'})")
    ranked = sorted(priced, key=lambda pair: _rank(pair[1]))
    chosen = ranked[0][0]
    others = tuple(_alternative(r, best) for r, best in ranked[1:])
    if chosen.size == 1 and ranked[0][1].microbatches == 1:
        plan = chosen.layout
    else:
        plan = _plan_of(model, trace.blocks, chosen, PIPELINE_AXIS, _stage_alternatives(chosen) + others)
    return plan, PipelineReport(plan, chosen, tuple(results), trace_s, time.perf_counter() - start, tuple(skipped))


def _rank(option: PipelineOption) -> tuple:
    return (not option.fits, option.step_s if option.fits else option.peak_bytes)


def _plan_of(model, blocks, result: StageMeshResult, axis: str, alternatives: tuple[Alternative, ...]) -> Plan:
    assert result.best is not None
    return plan_for_option(model, blocks, result, result.best, axis, alternatives)


def plan_for_option(model, blocks, result: StageMeshResult, option: PipelineOption, axis: str = PIPELINE_AXIS,
                    alternatives: tuple[Alternative, ...] = ()) -> Plan:
    """The plan file of one of ``result``'s priced options (its best, or another one: the
    fidelity benchmark measures several), its collectives predicted for one microbatch."""
    names = [n for n, _ in model.named_parameters()]  # buffer-only modules (rotary tables) stay on every stage
    covers = outer_modules(names, result.named, blocks.fqn)
    index = result.axis_index if result.plan_axis_index is None else result.plan_axis_index
    return pipelined_plan(result.layout, option, blocks, covers, axis, index, alternatives,
                          lambda recompute: predicted_tables(result, option, recompute))


def _alternative(result: StageMeshResult, option: PipelineOption) -> Alternative:
    schedule = option.schedule.name if option.size > 1 else "none"
    return Alternative(mesh_words(result), option.stage_count, schedule, option.microbatches, option.step_s,
                       int(option.peak_bytes), option.fits)


def _stage_alternatives(result: StageMeshResult) -> tuple[Alternative, ...]:
    """On the chosen mesh: the best candidate of each other stage count (other stages per rank)."""
    best: dict[int, PipelineOption] = {}
    for option in result.options:
        held = best.get(option.stage_count)
        if held is None or _rank(option) < _rank(held):
            best[option.stage_count] = option
    chosen = result.best.stage_count if result.best else 0
    return tuple(_alternative(result, o) for count, o in sorted(best.items()) if count != chosen)


def _progress(progress, text: str) -> None:
    if progress is not None:
        progress(text)



