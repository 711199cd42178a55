"""A pipelined plan's stages in tables: what each holds, its time and memory, and what
fewer or more stages would have cost (``plan/pipeline_plan.py``)."""

from __future__ import annotations

from autoplan.tree_paths import fqn_within
from autoplan.units import ms, nbytes


def folded_modules(modules: tuple[str, ...]) -> str:
    """``model.layers.3, model.layers.4, model.layers.5`` -> ``model.layers.3-5``."""
    out: list[str] = []
    run: list[tuple[str, int]] = []

    def flush():
        if run:
            head, first, last = run[0][0], run[0][1], run[-1][1]
            out.append(f"{head}.{first}" if first == last else f"{head}.{first}-{last}")
            run.clear()

    for module in modules:
        head, _, tail = module.rpartition(".")
        if tail.isdigit() and (not run or (run[-1][0] == head and run[-1][1] + 1 == int(tail))):
            run.append((head, int(tail)))
            continue
        flush()
        if tail.isdigit():
            run.append((head, int(tail)))
        else:
            out.append(module)
    flush()
    return ", ".join(out)


def pipeline_sections(plan) -> list:
    """The stage table and the alternatives table of ``plan`` (none without a pipeline)."""
    from autoplan.explain.render import Section

    pipeline = plan.pipeline
    if pipeline is None:
        return []
    shape, names = pipeline.full_mesh(tuple(plan.mesh_shape), tuple(plan.axis_names))
    mesh = " x ".join(f"{n} {s}" for n, s in zip(names, shape))
    stages_per_rank = f", {pipeline.virtual} stages per rank" if pipeline.virtual > 1 else ""
    stage_rows: list[tuple[str, ...]] = []
    for i, stage in enumerate(pipeline.stages):
        held = [m for m in plan.recompute if any(fqn_within(m, s) for s in stage.modules)]
        checkpointed = sorted({plan.recompute[m] for m in held})
        recompute = f"{len(held)} blocks {'/'.join(checkpointed)}" if held else "-"
        stage_rows.append((str(i), str(stage.rank), folded_modules(stage.modules), ms(stage.forward_s), ms(stage.backward_s),
                     nbytes(stage.peak_memory_bytes), recompute))
    sections = [Section(
        f"pipeline: {pipeline.schedule} on {mesh}{stages_per_rank}, {pipeline.microbatches} microbatches; "
        f"bubble {pipeline.bubble_share:.1%} of the step, sends not hidden {ms(pipeline.p2p_s)} ms",
        ("stage", "pp rank", "modules", "forward ms", "backward ms", "peak per device", "checkpointed"),
        tuple(stage_rows),
        notes=(("forward and backward: one microbatch through the stage, sends to the next stage included; "
                "peak: the rank's parameters, gradients and optimizer state, and the activations of the "
                "microbatches the schedule keeps in flight there"),),
        right=(3, 4, 5),
    )]
    if pipeline.alternatives:
        rows: list[tuple[str, ...]] = [("(the plan)", str(len(pipeline.stages)), pipeline.schedule, str(pipeline.microbatches),
                 ms(plan.predicted.step_time_s), "0", nbytes(plan.predicted.peak_memory_bytes), "yes")]
        for a in pipeline.alternatives:
            rows.append((a.mesh, str(a.stages), a.schedule, str(a.microbatches), ms(a.step_time_s),
                         f"{(a.step_time_s - plan.predicted.step_time_s) * 1e3:+.3f}", nbytes(a.peak_memory_bytes),
                         "yes" if a.fits else "NO"))
        sections.append(Section(
            "what fewer or more stages would cost (the best of each stage count and mesh shape priced)",
            ("mesh", "stages", "schedule", "microbatches", "step ms", "vs plan ms", "peak per device", "fits"),
            tuple(rows),
            right=(1, 3, 4, 5, 6),
        ))
    return sections
