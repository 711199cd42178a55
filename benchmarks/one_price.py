"""Issue 45's one price: the solver's objective, the reported step time and the priced dry run agree.

Per row (a model on a mesh under a budget): the ILP's own price of the plan kept, the
plan's ``solver.objective``, its ``predicted.step_time_s`` (what ``show``, ``score`` and
``explain`` print, and ``show``'s "other" row: its priced collective table less the
communication it counts), and the step that runs: the plan applied to the whole model on a
fake process group, one training step on fake tensors with a batch drawn as ``verify``
draws it (``verify_plan(tensors="fake")``), every collective counted and priced by
``cost/comm.py``, plus the plan's compute. The gap is the largest of objective and reported
against that dry run. Rows: the zoo models (``benchmarks/zoo.py``), issue 45's four
HuggingFace configs at real widths (``benchmarks/models/real_width.py``), each under the
default budget and a forcing one (zoo's: half the model state sharded away), and the
baselines of two zoo models.

    python benchmarks/one_price.py [--rows zoo,real,baselines] [--models llama,moe] [--out benchmarks/results/one_price.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from zoo import AXIS_NAMES, MODELS, plan_row  # noqa: E402

from autoplan.cost.comm import table_seconds  # noqa: E402
from autoplan.cost.profile import load_profile  # noqa: E402
from autoplan.errors import AutoplanError  # noqa: E402
from autoplan.evaluate.baselines import BASELINES, build_baseline  # noqa: E402
from autoplan.explain.show import summarize  # noqa: E402
from autoplan.model_file import import_model_file, load_model_file  # noqa: E402
from autoplan.verify.fake_world import fake_world  # noqa: E402
from autoplan.verify.numerics import build_seeded, seeded_batch  # noqa: E402
from autoplan.verify.step_check import verify_plan  # noqa: E402

REAL = "benchmarks/models/real_width.py"
REAL_ROWS = ((f"{REAL}:qwen2_1p5b", (2, 4)), (f"{REAL}:neox_410m", (2, 2, 2)), (f"{REAL}:t5_small", (8,)),
             (f"{REAL}:vit_base", (2, 4)))
BASELINE_ROWS = (("examples/llama.py", (2, 4)), ("examples/gpt2.py", (2, 4)))


def dry_run_seconds(spec: str, plan) -> tuple[float, bool]:
    """(the plan's compute + its whole step's collectives priced, whether they are the predicted ones)."""
    loaded = load_model_file(spec)
    module = import_model_file(loaded.path)
    # the step as the plan's devices run it: a shard-to-shard move is one all_to_all there
    with fake_world(plan.mesh_shape, plan.axis_names, as_on_devices=True) as mesh:
        with torch.device("meta"):
            shapes_only = build_seeded(module, loaded.builder, 0)
        batch = seeded_batch(module, 1)  # after the builder, which sets the batch's shape
        verification = verify_plan(shapes_only, batch, plan, mesh, loss_fn=loaded.loss_fn, tensors="fake",
                                   real_model=lambda: build_seeded(module, loaded.builder, 0))
    observed: dict = {}
    for row in verification.rows:
        count, nbytes = row.observed
        if count:
            observed.setdefault(row.module, {}).setdefault(row.axis, {})[row.kind] = {"count": count, "bytes": nbytes}
    comm = table_seconds(observed, load_profile(plan.profile), plan.mesh_shape, plan.axis_names)
    return plan.predicted.compute_s + comm, verification.passed


def measure(spec: str, mesh, budget: str, plan, report, plan_cpu_s: float) -> dict:
    dry, passed = dry_run_seconds(spec, plan)
    summary = summarize(plan)
    objective, reported = plan.solver.objective, plan.predicted.step_time_s
    gap = max(abs(objective - dry), abs(reported - dry)) / dry if dry > 0 else 0.0
    return {
        "model": spec.replace(f"{REAL}:", "").replace("examples/", "").removesuffix(".py"),
        "mesh": "x".join(map(str, mesh)), "budget": budget,
        "ilp_s": (report.extra.get("ilp_objective_s") if report is not None else None),
        "objective_s": objective, "reported_s": reported, "show_other_s": summary.comm_other_s,
        "dry_run_s": dry, "gap": gap, "collectives_as_predicted": passed, "plan_cpu_s": plan_cpu_s,
    }


def zoo_rows(specs, meshes):
    for spec in specs:
        for mesh in meshes:
            for forcing in (False, True):
                yield spec, mesh, forcing


def planned(spec: str, mesh, forcing: bool):
    started = time.process_time()
    plan, report, budget = plan_row(spec, mesh, forcing)
    return plan, report, ("default" if budget is None else f"{budget:.3g} GiB"), time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="zoo,real,baselines")
    parser.add_argument("--models", default=",".join(MODELS), help="zoo models (examples/NAME.py)")
    parser.add_argument("--meshes", default="2x4", help="meshes of the zoo rows")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/one_price.json"))
    args = parser.parse_args()
    kinds = set(args.rows.split(","))
    meshes = [tuple(int(n) for n in m.split("x")) for m in args.meshes.split(",")]
    jobs: list[tuple[str, tuple, object]] = []
    if "zoo" in kinds:
        jobs += [(f"examples/{m}.py", mesh, forcing) for m, mesh, forcing in zoo_rows(args.models.split(","), meshes)]
    if "real" in kinds:
        jobs += [(spec, mesh, forcing) for spec, mesh in REAL_ROWS for forcing in (False, True)]
    if "baselines" in kinds:
        jobs += [(spec, mesh, name) for spec, mesh in BASELINE_ROWS for name in BASELINES]
    console = Console(stderr=True)
    rows = []
    for i, (spec, mesh, how) in enumerate(jobs, 1):
        console.print(f"[{i}/{len(jobs)}] {spec} on {'x'.join(map(str, mesh))} ({how})")
        try:
            if isinstance(how, str):  # a baseline
                loaded = load_model_file(spec)
                started = time.process_time()
                baseline = build_baseline(how, loaded.model, loaded.example_inputs, mesh, AXIS_NAMES[len(mesh)],
                                          loss_fn=loaded.loss_fn)
                row = measure(spec, mesh, f"baseline {how}", baseline.plan, None, time.process_time() - started)
            else:
                plan, report, budget, cpu = planned(spec, mesh, how)
                row = measure(spec, mesh, ("forcing " + budget) if how else budget, plan, report, cpu)
        except AutoplanError as err:
            console.print(f"  skipped: {err}")
            continue
        rows.append(row)
        console.print(f"  objective {row['objective_s'] * 1e3:.3f} ms, reported {row['reported_s'] * 1e3:.3f} ms, "
                      f"dry run {row['dry_run_s'] * 1e3:.3f} ms, gap {row['gap']:.2%}")
    table = Table(title="one price: solver objective, reported step time, priced dry run (ms)")
    for column in ("model", "mesh", "budget", "ILP's own", "objective", "reported", "show other", "dry run", "gap",
                   "as predicted", "plan CPU s"):
        table.add_column(column, justify="left" if column in ("model", "mesh", "budget") else "right")

    def ms(value):
        return "-" if value is None else f"{value * 1e3:.3f}"

    for r in rows:
        table.add_row(r["model"], r["mesh"], r["budget"], ms(r["ilp_s"]), ms(r["objective_s"]), ms(r["reported_s"]),
                      ms(r["show_other_s"]), ms(r["dry_run_s"]), f"{r['gap']:.2%}", "yes" if r["collectives_as_predicted"] else "NO",
                      f"{r['plan_cpu_s']:.1f}")
    Console(width=200).print(table)
    if rows:
        worst = max(rows, key=lambda r: r["gap"])
        print(f"largest gap: {worst['gap']:.2%} ({worst['model']} on {worst['mesh']}, {worst['budget']})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
