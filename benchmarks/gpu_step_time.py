"""Predicted vs measured step time on one GPU: does a calibrated profile price real kernels?

    python benchmarks/gpu_step_time.py [--models transformer,gpt2,llama]
                                       [--profiles h100-sxm-calibrated,h100-sxm]
                                       [--stage all|plan|measure] [--plans DIR] [--steps 6] [--warmup 2]

For each example's real-shape model (``make_big`` in ``examples/NAME.py``) it plans a
one-device mesh under each profile (``--stage plan``, no GPU needed), then builds the model
on the GPU, applies the first profile's plan (DTensor on a one-device NCCL mesh) and times
training steps, forward + backward + AdamW (``--stage measure``). It prints the median
step time, each profile's prediction and its error, and predicted vs measured peak memory.
The model is also timed without ``apply_plan``, to show what eager DTensor adds.

The two stages can run on different machines (``--plans DIR`` carries the plans between
them): a GPU host whose torch is older than the one autoplan traces with can still time
plans made elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,gpt2,llama")
    parser.add_argument("--profiles", default="h100-sxm-calibrated,h100-sxm")
    parser.add_argument("--stage", choices=("all", "plan", "measure"), default="all")
    parser.add_argument("--plans", default=str(ROOT / "benchmarks" / "results" / "gpu_plans"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    models, profiles, plans = args.models.split(","), args.profiles.split(","), Path(args.plans)
    if args.stage in ("all", "plan"):
        make_plans(models, profiles, plans)
    if args.stage in ("all", "measure"):
        report(models, profiles, plans, measure(models, profiles[0], plans, args.steps, args.warmup))
    return 0


def plan_path(plans: Path, model: str, profile: str) -> Path:
    return plans / f"{model}-{Path(profile).stem}.json"


def make_plans(models, profiles, plans: Path) -> None:
    import autoplan
    from autoplan.model_file import load_model_file

    for model in models:
        loaded = load_model_file(str(ROOT / "examples" / f"{model}.py") + ":make_big")
        for profile in profiles:
            plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(1,), axis_names=("dp",),
                                    profile=profile, cache=False, broadcast=False)
            plan.save(plan_path(plans, model, profile))
            print(f"planned {model} under {profile}: {plan.predicted.step_time_s * 1e3:.1f} ms predicted", flush=True)


def measure(models, profile: str, plans: Path, steps: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import autoplan
    from autoplan.model_file import import_model_file

    if not torch.cuda.is_available():
        raise SystemExit("--stage measure needs a CUDA GPU; plan here with --stage plan and measure on the GPU host")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
    results = {}
    try:
        for model_name in models:
            example = import_model_file(ROOT / "examples" / f"{model_name}.py")
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = example.make_big()  # sets the example's shapes for example_inputs
            batch = _to_cuda(example.example_inputs())
            plain = _median_step(model, batch, steps, warmup)
            torch.cuda.reset_peak_memory_stats()
            plan = autoplan.Plan.load(plan_path(plans, model_name, profile))
            model = autoplan.apply_plan(model, plan, mesh)
            applied = _median_step(model, autoplan.shard_batch(batch, plan, mesh), steps, warmup)
            results[model_name] = {"plain_s": plain, "applied_s": applied, "peak_bytes": torch.cuda.max_memory_allocated()}
            del model
            torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return results


def _to_cuda(batch):
    if isinstance(batch, dict):
        return {key: value.cuda() for key, value in batch.items()}
    return tuple(value.cuda() for value in batch)


def _median_step(model, batch, steps: int, warmup: int) -> float:
    import torch

    import autoplan

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for _ in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        output = model(**batch) if isinstance(batch, dict) else model(*batch)
        autoplan.training_loss(output).backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def report(models, profiles, plans: Path, measured: dict) -> None:
    from autoplan.plan.module_plan import Plan

    print(f"{'model':<12} {'plain ms':>9} {'applied ms':>10}  " + "  ".join(f"{p + ' ms (err)':>30}" for p in profiles)
          + f"  {'peak GiB pred/meas':>18}")
    rows = []
    for model in models:
        m = measured[model]
        predicted = {profile: Plan.load(plan_path(plans, model, profile)).predicted for profile in profiles}
        cells, row = [], {"model": model, **m, "predicted_s": {}}
        for profile, prediction in predicted.items():
            row["predicted_s"][profile] = prediction.step_time_s
            error = prediction.step_time_s / m["applied_s"] - 1
            cells.append(f"{prediction.step_time_s * 1e3:>20.1f} ({error:+6.1%})")
        peak = predicted[profiles[0]].peak_memory_bytes
        print(f"{model:<12} {m['plain_s'] * 1e3:>9.1f} {m['applied_s'] * 1e3:>10.1f}  " + "  ".join(cells)
              + f"  {peak / 2**30:>8.1f} / {m['peak_bytes'] / 2**30:<7.1f}")
        rows.append(row)
    out = plans / "gpu_step_time.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"results written to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
