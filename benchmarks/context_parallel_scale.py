"""Context parallel at scale (issue 48): Llama-3-8B at 8 sequences of 131072 tokens, bf16, on
an 8x8 H100-preset mesh, planned with the sequence split over one axis and without.

    python benchmarks/context_parallel_scale.py [--context-axis cp] [--json out.json]

``autoplan.pipeline.context_parallel.suggest_context_parallel`` (what ``autoplan suggest
MODEL --mesh 8x8 --axis-names dp,cp --context-axis cp`` runs) on
``benchmarks/models/llama3_8b_128k.py``, profile h100-sxm, the device's memory as budget:
one solve with the batch's sequence pinned split on the context axis (the solver lays out
the rest, checkpointing included), one as ``suggest`` plans it without (the axis is then a
mesh axis like any other, named cp). Prints the planning time (wall and CPU seconds of this
process), each plan's layout in words, predicted step time, peak memory per device and MFU
(6·N·tokens plus attention's products), and which plan is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

GIB = 2**30


def _progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def plan_row(context_axis: str, plans_dir: str | None = None) -> dict:
    import llama3_8b_128k as model_file

    from autoplan.explain.show import summarize
    from autoplan.pipeline.context_parallel import suggest_context_parallel

    with torch.device("meta"):
        model = model_file.build_model()
        batch = model_file.example_inputs()
    wall, cpu = time.perf_counter(), time.process_time()
    choice = suggest_context_parallel(model, batch, (8, 8), ("dp", context_axis), context_axis, profile="h100-sxm",
                                      progress=_progress)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = {}
    for name, plan in (("with context parallel", choice.context_plan), ("without", choice.plain_plan)):
        if plan is None:
            rows[name] = {"failed": "no plan fits the budget"}
            continue
        summary = summarize(plan)
        if plans_dir:
            plan.save(Path(plans_dir) / f"llama3_8b_128k-{'context' if plan.context_parallel else 'plain'}.json")
        rows[name] = {
            "step_s": plan.predicted.step_time_s,
            "compute_s": plan.predicted.compute_s,
            "comm_s": plan.predicted.comm_s,
            "peak_gib": plan.predicted.peak_memory_bytes / GIB,
            "mfu": summary.mfu,
            "recompute": f"{len(plan.recompute)} of 32 layers" if plan.recompute else "none",
            "layout": _layout_words(summary),
        }
    kept = "with context parallel" if choice.plan.context_parallel is not None else "without"
    return {"planning_wall_s": wall, "planning_cpu_s": cpu, "kept": kept, "plans": rows}


def _layout_words(summary) -> list[str]:
    """The layout per module in words, one line per folded module row that is not all replicated."""
    words = []
    for row in summary.rows:
        said = ", ".join(f"{axis}: {w}" for axis, w in zip(summary.axis_names, row.words))
        words.append(f"{row.name}: {said}")
    return words


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context-axis", default="cp", help="the name of the 8x8 mesh's second axis, the context axis")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--plans-dir", help="also write both plans there (llama3_8b_128k-context.json, -plain.json)")
    args = parser.parse_args(argv)
    result = plan_row(args.context_axis, args.plans_dir)
    print(f"Llama-3-8B, 8 x 131072 tokens, bf16, 8x8 h100-sxm; torch {torch.__version__}")
    print(f"planning: {result['planning_wall_s']:.1f} s wall, {result['planning_cpu_s']:.1f} s CPU (both solves)")
    for name, row in result["plans"].items():
        if "failed" in row:
            print(f"\n{name}: {row['failed']}")
            continue
        mfu = "-" if row["mfu"] is None else f"{row['mfu']:.1%}"
        print(f"\n{name}: step {row['step_s']:.2f} s (compute {row['compute_s']:.2f} s, communication {row['comm_s']:.2f} s), "
              f"peak {row['peak_gib']:.2f} GiB per device, MFU {mfu}, recompute {row['recompute']}")
        for line in row["layout"]:
            print(f"  {line}")
    print(f"\nkept: {result['kept']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
