"""Issue 21's must-show 1: planned models trained eagerly and under ``torch.compile``.

For each model, a plan that shards weights (the forcing budget of ``benchmarks/zoo.py``:
half the model state sharded away) is applied and one training step is run eagerly and
compiled (per repeated block, as torchtitan compiles, where the model has blocks; else
the whole model), on a fake process group of 8 (mesh 2x4) and on 4 gloo processes on
127.0.0.1 (mesh 2x2). Printed per model and mesh: the eager and the compiled loss, their
relative difference, the seconds the first compiled step took beyond an eager one
(compilation), and whether each step ran exactly the predicted collectives (fake process
group; ``autoplan verify``'s comparison). Fake collectives compute nothing real, so their
losses compare only eager with compiled; the gloo losses are real.

    python benchmarks/compile_table.py [--models mlp,cnn,transformer,gpt2,bert,llama,nanogpt]
                                       [--backend inductor] [--no-gloo]

Models are ``examples/NAME.py``; ``nanogpt`` is ``tests/models/nanogpt.py`` (a nanoGPT-style
GPT in plain PyTorch); ``torchtitan:FAMILY`` and ``litgpt:NAME`` are the rows of
``plain_coverage.py`` (``plain_models.py``: built tiny, with their library's training loss;
torchtitan and litgpt installed as docs/models.md, "Measuring it", says), e.g. ``torchtitan:llama3+sdpa``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from zoo import plan_row  # noqa: E402

import autoplan  # noqa: E402
from autoplan._process_group import free_port, process_group  # noqa: E402
from autoplan._processes import start_ranks  # noqa: E402
from autoplan.explain.progress import rows_on_stderr  # noqa: E402
from autoplan.model_file import import_model_file, load_model_file  # noqa: E402
from autoplan.verify.compiled import compile_model  # noqa: E402
from autoplan.verify.numerics import build_seeded, seeded_batch  # noqa: E402
from autoplan.verify.step_check import verify_plan  # noqa: E402

MODELS = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama", "nanogpt")
FAKE_MESH, GLOO_MESH = (2, 4), (2, 2)
AXES = ("dp", "tp")


_WRITTEN = Path(tempfile.mkdtemp(prefix="autoplan-compile-models-"))


def model_path(name: str) -> Path:
    """The model file of a row name (a plain-PyTorch row's is written once, for every process)."""
    if name == "nanogpt":
        return ROOT / "tests" / "models" / "nanogpt.py"
    if ":" not in name:
        return ROOT / "examples" / f"{name}.py"
    from plain_models import model_file_text

    source, _, row = name.partition(":")
    path = _WRITTEN / f"{source}_{''.join(c if c.isalnum() else '_' for c in row)}.py"
    if not path.exists():
        path.write_text(model_file_text(source, row))
    return path


def compile_mode(model) -> str:
    """"block" where the model has repeated blocks (an nn.ModuleList of one class), else "whole"."""
    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len({type(b) for b in m}) == 1 and len(m)]
    return "block" if blocks else "whole"


def fake_rows(name: str, plan, backend: str) -> dict:
    """Eager and compiled steps on a fake process group of 8: losses, compile seconds, collectives."""
    path = model_path(name)
    module = import_model_file(path)
    loaded = load_model_file(str(path))
    row = {"mode": compile_mode(build_seeded(module, "build_model", 0))}
    torch._dynamo.reset()  # code compiled for the last model guards on its (destroyed) process group
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", FAKE_MESH, mesh_dim_names=AXES)
        batch = seeded_batch(module, 1)
        start = time.perf_counter()
        eager = verify_plan(build_seeded(module, "build_model", 0), batch, plan, mesh, loss_fn=loaded.loss_fn)
        eager_s = time.perf_counter() - start
        mode = row["mode"]
        start = time.perf_counter()
        compiled = verify_plan(build_seeded(module, "build_model", 0), batch, plan, mesh, loss_fn=loaded.loss_fn,
                               compile_mode=mode, backend=backend)
        row.update(eager=eager.loss, compiled=compiled.loss,
                   compile_s=time.perf_counter() - start - eager_s,
                   eager_ok=eager.passed, compiled_ok=compiled.passed)
    except Exception as err:  # reported in the table
        row["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:100]}"
    finally:
        dist.destroy_process_group()
    return row


def gloo_worker(rank: int, world: int, port: int, jobs: list[tuple[str, str, str]], backend: str, out: str) -> None:
    """Each job (model file, plan JSON, compile mode): one eager and one compiled step from the
    same weights and batch; rank 0 writes the losses and the compile seconds."""
    torch.set_num_threads(1)
    results = []
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world):
        mesh = init_device_mesh("cpu", GLOO_MESH, mesh_dim_names=AXES)
        for path, plan_json, mode in jobs:
            torch._dynamo.reset()  # each model's compile timed from scratch
            plan = autoplan.Plan.from_dict(json.loads(plan_json))
            module = import_model_file(Path(path))
            loss_fn = load_model_file(path).loss_fn
            build_seeded(module, "build_model", 0)  # a plain-PyTorch row's inputs follow its model
            batch = seeded_batch(module, 1)
            try:
                losses, seconds = [], []
                for compiled in (False, True):
                    model = autoplan.apply_plan(build_seeded(module, "build_model", 0), plan, mesh, loss_fn=loss_fn)
                    call = compile_model(model, mode, backend) if compiled else model
                    local = autoplan.shard_batch(batch, plan, mesh)
                    start = time.perf_counter()
                    output = call(**local) if isinstance(local, dict) else call(*local)
                    loss = autoplan.training_loss(output)  # apply_plan computes loss_fn's loss
                    loss.backward()
                    seconds.append(time.perf_counter() - start)
                    losses.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss))
                results.append({"eager": losses[0], "compiled": losses[1], "compile_s": seconds[1] - seconds[0]})
            except Exception as err:  # reported in the table
                results.append({"error": f"{type(err).__name__}: {' '.join(str(err).split())[:100]}"})
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def gloo_rows(jobs: list[tuple[str, str, str]], backend: str) -> list[dict]:
    world = GLOO_MESH[0] * GLOO_MESH[1]
    with tempfile.TemporaryDirectory(prefix="autoplan-compile-") as tmp:
        out = Path(tmp) / "results.json"
        start_ranks(gloo_worker, (world, free_port(), jobs, backend, str(out)), nprocs=world)
        return json.loads(out.read_text())


HEADER = (f"{'model':24} {'mesh':12} {'compile':8} {'eager loss':>12} {'compiled loss':>14} {'rel diff':>9} "
          f"{'compile s':>10}  collectives (eager, compiled)")


def print_rows(rows: list[tuple[str, str, dict]]) -> None:
    for name, where, row in rows:
        if "error" in row:
            print(f"{name:24} {where:12} {row.get('mode', ''):8} FAILED {row['error']}")
            continue
        diff = abs(row["compiled"] - row["eager"]) / max(abs(row["eager"]), 1e-30)
        checks = ("as predicted" if row["eager_ok"] and row["compiled_ok"] else
                  f"eager {'ok' if row['eager_ok'] else 'DIFFERS'}, compiled {'ok' if row['compiled_ok'] else 'DIFFERS'}"
                  ) if "eager_ok" in row else "-"
        print(f"{name:24} {where:12} {row.get('mode', ''):8} {row['eager']:12.6f} {row['compiled']:14.6f} "
              f"{diff:9.1e} {row['compile_s']:10.1f}  {checks}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--no-gloo", action="store_true", help="fake process group only")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    print(f"torch {torch.__version__}, backend {args.backend}", flush=True)
    print(HEADER, flush=True)

    rows, jobs = [], []
    with rows_on_stderr(len(names) + (0 if args.no_gloo else 1), "models planned, compiled and checked") as progress:
        for name in names:
            progress.started(name)
            plan, _, _ = plan_row(str(model_path(name)), FAKE_MESH, force_sharding=True)
            row = fake_rows(name, plan, args.backend)
            rows.append((name, "2x4 fake", row))
            print_rows(rows[-1:])
            sys.stdout.flush()
            if not args.no_gloo:
                small, _, _ = plan_row(str(model_path(name)), GLOO_MESH, force_sharding=True)
                jobs.append((str(model_path(name)), small.to_json(), row["mode"]))
            progress.finished(name)
        if jobs:
            progress.started("every model on 4 gloo processes")
            for name, (_, _, mode), row in zip(names, jobs, gloo_rows(jobs, args.backend)):
                rows.append((name, "2x2 gloo", {**row, "mode": mode}))
            progress.finished("every model on 4 gloo processes")
    print()
    print(HEADER)
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
