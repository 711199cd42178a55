"""Llama-3-8B as it is pretrained: 32 layers on 8x8, 64 sequences per step, 80 GiB per device.

For each sequence length (4096 and 8192 tokens by default), ``autoplan.suggest``'s problem
on the 8x8 ``h100-sxm`` mesh is solved once with checkpointing left to the solver, and the
plan's layout is scored again with every layer checkpointed "full" (torchtitan's default
recipe) and with none. The plan's peak per device is then measured as
``benchmarks/memory.py`` measures it: applied on rank 0 of a fake process group to a
model of fake tensors (real shapes, no memory), one training step after a warm-up step,
under ``MemTracker``.

    python benchmarks/pretrain_8b.py [--seq 4096,8192] [--batch 64] [--no-measure] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory import measure_step  # noqa: E402

from autoplan._files import write_atomic  # noqa: E402
from autoplan.errors import InfeasibleError  # noqa: E402
from autoplan.evaluate.score import score_problem  # noqa: E402
from autoplan.model_file import import_model_file  # noqa: E402
from autoplan.pipeline.pinning import Pins  # noqa: E402
from autoplan.pipeline.problem import prepare_problem, solve_problem  # noqa: E402

GIB = 2**30
MESH, AXES, PROFILE = (8, 8), ("dp", "tp"), "h100-sxm"
LLAMA3 = ROOT / "examples" / "llama3.py"


def batch_of(batch: int, seq: int):
    vocab = import_model_file(LLAMA3).VOCAB_SIZE
    return dict(input_ids=torch.randint(0, vocab, (batch, seq)), labels=torch.randint(0, vocab, (batch, seq)))


def make(batch: int, seq: int):
    """(Llama-3-8B on meta, its batch function, no loss function: the model's own)."""
    with torch.device("meta"):
        model = import_model_file(LLAMA3).build_model()
    return model, lambda: batch_of(batch, seq), None


def run(batch: int, seq: int, measure: bool) -> dict:
    model, inputs, _ = make(batch, seq)
    with torch.device("meta"):
        example = inputs()
    started = time.perf_counter()
    problem = prepare_problem(model, example, MESH, AXES, PROFILE)
    row = {"tokens_per_sequence": seq, "sequences": batch, "budget_gib": problem.budget_bytes / GIB}
    try:
        plan, _, _ = solve_problem(problem, Pins(problem), recompute=True)
    except InfeasibleError as err:
        row["failed"] = str(err)
        return row
    row["plan_s"] = round(time.perf_counter() - started, 1)
    layers = problem.layer_names()
    modes = sorted(set(plan.recompute.values()))
    row.update(recompute=", ".join(modes) or "none", layers_checkpointed=len(plan.recompute),
               step_ms=plan.predicted.step_time_s * 1e3, peak_gib=plan.predicted.peak_memory_bytes / GIB)
    for name, recompute in (("full", dict.fromkeys(layers, "full")), ("none", {})):
        if plan.recompute == recompute:
            scored_ms, scored_gib, fits = row["step_ms"], row["peak_gib"], True
        else:
            scored = score_problem(problem, replace(plan, recompute=recompute))
            scored_ms, scored_gib, fits = scored.step_time_s * 1e3, scored.peak_memory_bytes / GIB, scored.fits
        row[f"{name}_step_ms"], row[f"{name}_peak_gib"], row[f"{name}_fits"] = scored_ms, scored_gib, fits
    row["faster_than_full"] = 1 - row["step_ms"] / row["full_step_ms"]
    if measure:
        measuring = time.perf_counter()
        measured = measure_step(None, plan, make=lambda: make(batch, seq))
        row.update(measured_peak_gib=measured["peak"] / GIB, measure_s=round(time.perf_counter() - measuring, 1),
                   measured={k: v / GIB for k, v in measured.items()})
    return row


def describe(row: dict) -> str:
    head = f"{row['sequences']} x {row['tokens_per_sequence']} tokens on 8x8, budget {row['budget_gib']:.1f} GiB per device"
    if "failed" in row:
        return f"{head}\n  no plan: {row['failed']}"
    lines = [
        head,
        (f"  plan ({row['plan_s']} s): checkpointing {row['recompute']} on {row['layers_checkpointed']} of 32 layers, "
        f"{row['step_ms']:.1f} ms, predicted peak {row['peak_gib']:.2f} GiB"),
        (f"  same layout, full checkpointing on every layer: {row['full_step_ms']:.1f} ms, {row['full_peak_gib']:.2f} GiB"
        f" -> the plan is {row['faster_than_full']:.1%} faster"),
        f"  same layout, no checkpointing: {row['none_step_ms']:.1f} ms, {row['none_peak_gib']:.2f} GiB"
        + ("" if row["none_fits"] else " (does not fit)"),
    ]
    if "measured_peak_gib" in row:
        within = "within" if row["measured_peak_gib"] <= row["budget_gib"] else "OVER"
        error = row["peak_gib"] / row["measured_peak_gib"] - 1
        lines.append(f"  measured peak (MemTracker, fake tensors, {row['measure_s']} s): {row['measured_peak_gib']:.2f} GiB, "
                     f"{within} the budget; prediction {error:+.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="4096,8192", help="comma-separated tokens per sequence")
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (one per device on 8x8)")
    parser.add_argument("--no-measure", action="store_true", help="skip the MemTracker measurement")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = []
    print(f"torch {torch.__version__}, profile {PROFILE}")
    for seq in (int(s) for s in args.seq.split(",")):
        row = run(args.batch, seq, not args.no_measure)
        rows.append(row)
        print(describe(row), flush=True)
    if args.json:
        write_atomic(Path(args.json), json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
