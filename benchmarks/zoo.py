"""Issue 3's zoo table: one row per model x mesh (8), (2,4), (2,2,2).

Columns: traced graph nodes, decisions, fallback ops (no DTensor rule), opaque regions
(data-dependent), solve seconds, predicted step time and peak memory (H100 preset), the
plan applied on a fake process group of 8 ranks with forward + backward run ("ok"), and,
for the tiny configs, loss and gradients on 8 gloo processes equal to the single-device
model's within 1e-5 (the worst relative error is printed). Tiny configs are planned under
a budget that forces half of the model state to be sharded (as in tests/integration/zoo/test_zoo_numerics.py)
so the numerics exercise real sharding (where no plan gets that low on a mesh, halfway
between the least any plan needs and the unconstrained peak; the budget is printed). "big" rows plan each file's real-shape builder
(``make_big``, where the file has one; on --big-meshes) and skip execution.

    python benchmarks/zoo.py [--models mlp,cnn,...] [--meshes 8,2x4,2x2x2] [--big-meshes 2x4] [--fake-pg-timeout 180]

A fake-process-group step that runs longer than --fake-pg-timeout seconds is reported as TIMEOUT
(and its numerics are skipped).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autoplan  # noqa: E402
from autoplan.errors import InfeasibleError  # noqa: E402
from autoplan.explain.progress import rows_on_stderr  # noqa: E402
from autoplan.model_file import import_model_file, load_model_file, parse_mesh  # noqa: E402
from autoplan.pipeline.suggest import suggest_with_report  # noqa: E402
from autoplan.verify.numerics import NumericsJob, check_numerics  # noqa: E402

MODELS = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama", "llama_uneven", "moe")
AXIS_NAMES = {1: ("dp",), 2: ("dp", "tp"), 3: ("node", "dp", "tp")}  # "pp" would make a pipeline axis
TOLERANCE = 1e-5
FAKE_PG_TIMEOUT_S = 180


def plan_row(spec: str, mesh, force_sharding: bool):
    """(plan, report, budget in GiB or None). A forced budget asks for half of the model
    state sharded away; where no plan gets that low (activations that cannot be split on
    this mesh), halfway between the least any plan needs and the unconstrained peak. The
    plan is made for the model file's ``compute_loss`` where it has one."""
    names = AXIS_NAMES[len(mesh)]
    loaded = load_model_file(spec)
    plan, report = suggest_with_report(loaded.model, loaded.example_inputs, mesh, names, loss_fn=loaded.loss_fn)
    if not force_sharding:
        return plan, report, None
    peak = plan.predicted.peak_memory_bytes
    budget = (peak - 0.5 * plan.predicted.model_state_bytes) / 2**30
    try:
        loaded = load_model_file(spec)
        plan, report = suggest_with_report(loaded.model, loaded.example_inputs, mesh, names, memory_gib=budget, loss_fn=loaded.loss_fn)
    except InfeasibleError as err:
        budget = (err.smallest_bytes + peak) / 2 / 2**30
        loaded = load_model_file(spec)
        plan, report = suggest_with_report(loaded.model, loaded.example_inputs, mesh, names, memory_gib=budget, loss_fn=loaded.loss_fn)
    return plan, report, budget


def run_on_fake_pg(path: Path, plan, mesh, timeout_s: int) -> str:
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(timeout_s)
    try:
        example = import_model_file(path)
        torch.manual_seed(0)
        model = example.build_model()
        batch = example.example_inputs()
        device_mesh = init_device_mesh("cpu", mesh, mesh_dim_names=AXIS_NAMES[len(mesh)])
        autoplan.apply_plan(model, plan, device_mesh)
        local = autoplan.shard_batch(batch, plan, device_mesh)
        out = model(**local) if isinstance(local, dict) else model(*local)
        autoplan.training_loss(out).backward()
        return "ok"
    except Exception as err:  # reported in the table
        # The alarm may fire inside autograd's C++ engine, which rewraps it as a RuntimeError.
        if isinstance(err, TimeoutError) or _TIMED_OUT[0]:
            return f"TIMEOUT {timeout_s}s"
        return f"FAIL {type(err).__name__}: {' '.join(str(err).split())[:80]}"
    finally:
        signal.alarm(0)
        _TIMED_OUT[0] = False


_TIMED_OUT = [False]


def _out_of_time(signum, frame):
    _TIMED_OUT[0] = True
    raise TimeoutError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--meshes", default="8,2x4,2x2x2")
    parser.add_argument("--big-meshes", default="2x4", help="meshes for the real-shape (make_big) rows; '' for none")
    parser.add_argument("--fake-pg-timeout", type=int, default=FAKE_PG_TIMEOUT_S, help="seconds per fake-PG step")
    args = parser.parse_args()
    models = args.models.split(",")
    meshes = [parse_mesh(m) for m in args.meshes.split(",")]
    big_meshes = {parse_mesh(m) for m in args.big_meshes.split(",") if m}

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    rows, jobs = [], {}
    with rows_on_stderr(len(meshes) * len(models), "models x meshes planned") as progress:
        for mesh in meshes:
            for name in models:
                label = f"{name} on {'x'.join(map(str, mesh))}"
                progress.started(label)
                path = ROOT / "examples" / f"{name}.py"
                plan, report, budget = plan_row(str(path), mesh, force_sharding=True)
                fake = run_on_fake_pg(path, plan, mesh, args.fake_pg_timeout)
                rows.append([name, "tiny", mesh, report, plan, fake, budget])
                print(f"planned {label}: fake-PG {fake}", file=sys.stderr, flush=True)
                if fake == "ok":  # a plan that cannot step on one process would stall 8 of them
                    jobs.setdefault(mesh, []).append((len(rows) - 1, NumericsJob(str(path), "build_model", plan.to_json())))
                if mesh in big_meshes and hasattr(import_model_file(path), "make_big"):
                    plan, report, budget = plan_row(f"{path}:make_big", mesh, force_sharding=False)
                    rows.append([name, "big", mesh, report, plan, "-", budget])
                progress.finished(label)
    dist.destroy_process_group()

    print_table(rows, {}, pending=bool(jobs))  # the planning columns now: the gloo runs take long
    numerics = {}
    with rows_on_stderr(len(jobs), "meshes checked on 8 gloo processes") as progress:
        for mesh, indexed in jobs.items():
            label = f"{len(indexed)} models on {'x'.join(map(str, mesh))}"
            progress.started(label)
            results = check_numerics([job for _, job in indexed], world=8)
            for (row, _), result in zip(indexed, results):
                numerics[row] = result.worst
                print(f"gloo numerics {rows[row][0]} on {'x'.join(map(str, mesh))}: {result.worst:.1e}", file=sys.stderr, flush=True)
            progress.finished(label)
    if jobs:
        print_table(rows, numerics, pending=False)


def print_table(rows, numerics: dict, pending: bool) -> None:
    header = ("model", "config", "mesh", "nodes", "decisions", "fallback", "opaque", "solve s",
              "step ms", "peak GiB", "budget GiB", "fake-PG f+b", "gloo max rel err")
    print(" | ".join(header))
    for index, (name, config, mesh, report, plan, fake, budget) in enumerate(rows):
        err = numerics.get(index)
        gloo = "-" if err is None else f"{'ok' if err <= TOLERANCE else 'FAIL'} {err:.1e}"
        if pending and fake == "ok":
            gloo = "(running)"
        print(" | ".join([
            name, config, "x".join(map(str, mesh)), str(report.graph_nodes), str(report.decisions),
            str(len(plan.fallback_ops)), str(len(plan.opaque_modules)), f"{report.stage_seconds['solve']:.2f}",
            f"{plan.predicted.step_time_s * 1e3:.3f}", f"{plan.predicted.peak_memory_bytes / 2**30:.3f}",
            "-" if budget is None else f"{budget:.4f}", fake, gloo,
        ]), flush=True)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - started:.0f} s")
