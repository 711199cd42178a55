"""``autoplan suggest`` with a pipeline axis (``--axis-names pp,dp,tp``) or a device count (``--devices N``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoplan._files import check_outputs, write_outputs
from autoplan.model_file import load_model_file


def run_pipelined(args: argparse.Namespace, mesh: tuple[int, ...] | None, axis_names: tuple[str, ...] | None) -> int:
    """Plan with pipeline stages on ``mesh`` (its "pp" axis), or choose the mesh for ``args.devices``."""
    loaded = load_model_file(args.model)
    where = "x".join(map(str, mesh)) if mesh is not None else f"{args.devices}-devices"
    out = args.out or str(Path("plans_out") / f"{loaded.name}-{where}.json")
    outputs = {"--out": out, **({"--stats": args.stats} if args.stats else {})}
    check_outputs(outputs, {"the model file": loaded.path})
    from autoplan.explain.progress import progress_on_stderr
    from autoplan.explain.render import Section, render
    from autoplan.explain.show import show_sections, summarize
    from autoplan.pipeline_parallel.planner import mesh_words, suggest_devices, suggest_pipelined
    from autoplan.units import ms, nbytes

    options = dict(profile=args.profile, memory_gb=args.memory_gb, memory_gib=args.memory_gib, loss_fn=loaded.loss_fn,
                   compile=args.compile, time_limit_s=args.time_limit)
    with progress_on_stderr() as progress:
        if mesh is not None:
            plan, report = suggest_pipelined(loaded.model, loaded.example_inputs, mesh, axis_names, progress=progress,
                                             **options)
        else:
            plan, report = suggest_devices(loaded.model, loaded.example_inputs, args.devices, args.devices_per_node,
                                           progress=progress, **options)
    texts = {out: plan.to_json()}
    if args.stats:
        texts[args.stats] = json.dumps(report.stats(), indent=2, sort_keys=True) + "\n"
    write_outputs(texts, outputs)
    sections = []
    if len(report.meshes) > 1:
        rows = []
        for r in sorted(report.meshes, key=lambda r: (r.best is None, not (r.best and r.best.fits),
                                                      r.best.step_s if r.best else 0.0)):
            b = r.best
            if b is None:
                rows.append((mesh_words(r), "-", "-", "-", "-", "-", "-", f"{r.seconds:.1f}"))
                continue
            schedule = b.schedule.name if b.size > 1 else "none"
            rows.append((mesh_words(r), str(b.stage_count), schedule, str(b.microbatches), ms(b.step_s),
                         nbytes(b.peak_bytes), "yes" if b.fits else "NO", f"{r.seconds:.1f}"))
        sections.append(Section(
            f"mesh shapes of {args.devices} devices (fastest that fits first; chosen: {mesh_words(report.chosen)})",
            ("mesh", "stages", "schedule", "microbatches", "step ms", "peak per device", "fits", "planned in s"),
            tuple(rows), notes=report.skipped[:5], right=(1, 3, 4, 5, 7),
        ))
    render(sections + show_sections(summarize(plan)), sys.stdout)
    print(f"planned in {report.total_s:.1f} s (trace {report.trace_s:.1f} s, {len(report.meshes)} mesh(es))")
    print(f"plan written to {out}")
    return 0
