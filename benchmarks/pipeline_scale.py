"""Pipeline stages and the mesh shape planned at scale: Llama-3 70B and 405B on 64 and 128
H100-preset devices, at a real batch (1024 sequences of 8192 tokens), against torchtitan's
published recipe for the same model scored by ``autoplan score``; and a dense model of
DeepSeek-V3's depth and widths (61 layers of latent attention, 1024 sequences of 4096
tokens) on 256.

    python benchmarks/pipeline_scale.py [--cases 70b:64,405b:128] [--json out.json]

Per case: ``autoplan.pipeline_parallel.planner.suggest_devices`` (what ``autoplan suggest
MODEL --devices N`` runs) on the model files in ``benchmarks/models/`` (8 devices per node,
profile h100-sxm), printing the chosen mesh shape, stages, schedule, microbatches,
predicted step time and memory per stage, the best of each other mesh shape, and the
planning time (wall and CPU seconds of this process).

torchtitan's recipe (``llama3_70b.toml``: FSDP 8 x TP 8 on 64 GPUs, local batch 8;
``llama3_405b.toml``: FSDP 16 x TP 8 on 128 GPUs, local batch 2; both full activation
checkpointing, no pipeline) is the ``torchtitan`` baseline plan (``evaluate/baselines.py``)
on that mesh with every block fully checkpointed, scored by ``autoplan.score`` (what
``autoplan score MODEL PLAN --microbatches K`` runs) with the batch reached by gradient
accumulation (1024 sequences in microbatches of the recipe's local batch): priced as the
pipeline planner prices its own one-stage candidates, a prediction, not a measurement.
Both run eager (the 405B recipe's float8 and torch.compile are not priced). Where a case
has no recipe (70B on 128, 405B on 64) its row says so.
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

CASES = ("70b:64", "70b:128", "405b:64", "405b:128", "dsv3dense:256")
MODEL_FILES = {"70b": "llama3_70b_pretrain", "405b": "llama3_405b_pretrain", "dsv3dense": "deepseek_v3_dense_pretrain"}
TITLES = {"70b": "Llama-3 70B", "405b": "Llama-3.1 405B", "dsv3dense": "DeepSeek-V3 depth and widths, dense"}
RECIPES = {("70b", 64): (8, 8, 8), ("405b", 128): (16, 8, 2)}
"""(FSDP degree, TP degree, local batch) of torchtitan's published recipe."""
PER_NODE = 8
GIB = 2**30


def _model(size: str):
    module = __import__(MODEL_FILES[size])
    with torch.device("meta"):
        model = module.build_model()
    return model, module.example_inputs()


def plan_case(size: str, devices: int) -> dict:
    from autoplan.explain.stages import folded_modules
    from autoplan.pipeline_parallel.planner import mesh_words, suggest_devices

    model, batch = _model(size)
    wall, cpu = time.perf_counter(), time.process_time()
    plan, report = suggest_devices(model, batch, devices, PER_NODE, "h100-sxm",
                                   progress=lambda text: print(f"  .. {text}", file=sys.stderr, flush=True))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    best = report.chosen.best
    assert best is not None
    stages = []
    if plan.pipeline is not None:
        for stage in plan.pipeline.stages:
            stages.append({"modules": folded_modules(stage.modules), "rank": stage.rank, "forward_s": stage.forward_s,
                           "backward_s": stage.backward_s, "peak_gib": stage.peak_memory_bytes / GIB})
    meshes = sorted(((mesh_words(r), r.best.step_s, r.best.peak_bytes / GIB, r.best.fits, r.best.schedule.name,
                      r.best.microbatches, r.best.stage_count) for r in report.meshes if r.best is not None),
                    key=lambda row: (not row[3], row[1]))
    return {
        "case": f"{size}:{devices}", "mesh": mesh_words(report.chosen), "schedule": best.schedule.name,
        "microbatches": best.microbatches, "stages": stages, "step_s": plan.predicted.step_time_s,
        "peak_gib": plan.predicted.peak_memory_bytes / GIB, "fits": best.fits, "bubble": best.bubble_share,
        "planning_wall_s": wall, "planning_cpu_s": cpu, "trace_s": report.trace_s,
        "meshes": [dict(zip(("mesh", "step_s", "peak_gib", "fits", "schedule", "microbatches", "stages"), m))
                   for m in meshes],
    }


def recipe_case(size: str, devices: int) -> dict | None:
    """torchtitan's recipe scored by ``autoplan score`` (see the module docstring)."""
    if (size, devices) not in RECIPES:
        return None
    import autoplan
    from autoplan.cost.profile import load_profile
    from autoplan.evaluate.baselines import baseline_for_problem
    from autoplan.pipeline.problem import prepare_problem
    from autoplan.pipeline_parallel.stage_mesh import batch_sequences

    fsdp, tp, local = RECIPES[(size, devices)]
    model, batch = _model(size)
    problem = prepare_problem(model, batch, (fsdp, tp), ("dp", "tp"), load_profile("h100-sxm"))
    recipe = baseline_for_problem("torchtitan", problem, recompute="full").plan  # the recipe as a plan file holds it
    accumulation = batch_sequences(batch) // (fsdp * local)
    wall, cpu = time.perf_counter(), time.process_time()
    score = autoplan.score(model, batch, recipe, "h100-sxm", microbatches=accumulation)
    return {"mesh": f"dp {fsdp} (FSDP) x tp {tp}", "accumulation": accumulation, "step_s": score.step_time_s,
            "peak_gib": score.peak_memory_bytes / GIB, "fits": score.fits, "checkpointed": len(score.plan.recompute),
            "score_wall_s": time.perf_counter() - wall, "score_cpu_s": time.process_time() - cpu}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="SIZE:DEVICES joined by commas")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    results = []
    for case in args.cases.split(","):
        size, devices = case.split(":")
        module = __import__(MODEL_FILES[size])
        print(f"== {TITLES[size]} on {devices} H100 (h100-sxm), {module.SEQUENCES} x {module.SEQ_LEN} tokens", flush=True)
        row = plan_case(size, int(devices))
        row["recipe"] = recipe_case(size, int(devices))
        results.append(row)
        print(f"chosen {row['mesh']}: {row['schedule']}, {row['microbatches']} microbatches, {len(row['stages'])} stages, "
              f"predicted step {row['step_s']:.2f} s, peak {row['peak_gib']:.2f} GiB ({'fits' if row['fits'] else 'OVER'}), "
              f"bubble {row['bubble']:.1%}")
        for i, stage in enumerate(row["stages"]):
            print(f"  stage {i:>2} (pp rank {stage['rank']}): {stage['modules']:<45} forward {stage['forward_s'] * 1e3:9.1f} ms"
                  f"  backward {stage['backward_s'] * 1e3:9.1f} ms  peak {stage['peak_gib']:6.2f} GiB")
        print("  other mesh shapes (best of each):")
        for m in row["meshes"][:8]:
            print(f"    {m['mesh']:<22} {m['stages']:>3} stages {m['schedule']:<22} {m['microbatches']:>4} mb  "
                  f"step {m['step_s']:9.2f} s  peak {m['peak_gib']:7.2f} GiB  {'fits' if m['fits'] else 'OVER'}")
        recipe = row["recipe"]
        if recipe is None:
            print("  torchtitan recipe: none published for this model on this many devices")
        else:
            print(f"  torchtitan recipe {recipe['mesh']}, {recipe['accumulation']} accumulation steps, full AC on "
                  f"{recipe['checkpointed']} blocks, by `autoplan score --microbatches {recipe['accumulation']}`: "
                  f"step {recipe['step_s']:.2f} s, peak {recipe['peak_gib']:.2f} GiB ({'fits' if recipe['fits'] else 'OVER'}); "
                  f"scored in {recipe['score_wall_s']:.1f} s wall")
        print(f"  planned in {row['planning_wall_s']:.1f} s wall, {row['planning_cpu_s']:.1f} s CPU "
              f"(trace {row['trace_s']:.1f} s, {len(row['meshes'])} mesh shapes)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
