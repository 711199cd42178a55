"""Beyond text: how many of timm's, diffusers', open_clip's and x-transformers' models autoplan plans, runs and compiles.

The vision, diffusion and contrastive part of the coverage benchmark (``hf_coverage.py``
is the HuggingFace part, ``plain_coverage.py`` the plain-PyTorch language models; the row
stages, table and summary are ``hf_coverage.py``'s, imported). Rows (``vision_models.py``):
one model per family of timm's registry, built tiny; diffusers' DiT, PixArt, SD3 and Flux
transformers and its conditional UNet; open_clip's model configs, one per distinct shrunk
architecture; x-transformers' decoder and encoder. Each row runs in its own process with a
timeout through the stages of ``hf_row.py`` (built and stepped on one CPU; planned on 2x4
with the default budget and with the forced budget that shards weights on both axes;
applied on a fake process group of 8 with one step; collectives equal to the prediction;
loss and gradients on 8 gloo processes against one device, within 1e-5, where the float32
step took at most ``--numerics-max-step`` seconds), then ``compile``: the forced plan's
step compiled whole (``--compile-backend``, default aot_eager) with the predicted
collectives and the eager step's loss (both with the model's randomness off, as
``autoplan verify --compile`` runs them).

    python benchmarks/vision_coverage.py [--models timm:convnext,diffusers:DiTTransformer2DModel,...]
                                         [--sources timm,diffusers] [--jobs N] [--no-numerics] [--list]
                                         [--compile-backend aot_eager|inductor|none] [--timeout 1800]
                                         [--json benchmarks/results/vision_coverage.json]
    python benchmarks/vision_coverage.py --join A.json B.json ... [--reruns] [--json OUT]

``--join``: the tables of runs over disjoint rows (``--sources timm``, then the others: a run
in parts; a run stopped early gives the rows it finished) as one table with one summary,
written to ``--json``; with ``--reruns`` a later table's row replaces the same row of an
earlier one (rows run again after a fix).

timm and open_clip need a torchvision built for the running torch; where they do not
import, their rows are reported as not installed and the other sources still run.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from hf_coverage import (  # noqa: E402 - after the sys.path lines above
    Printer,
    parse_args,
    row_cells,
    run_keys,
    run_rows,
    stage_ok,
    summary_lines,
    table_header,
)

DEFAULT_JSON = BENCH_DIR / "results" / "vision_coverage.json"
COMPILE_TOLERANCE = 1e-5
_COMPILE_BACKEND = ["aot_eager"]
"""The backend the rows compile with (``--compile-backend``; a row process hears it by its argv)."""


def select_rows(rows, models: str | None, sources: str | None) -> list[tuple[str, str]]:
    wanted = {m.strip() for m in (models or "").split(",") if m.strip()}
    kept = {s.strip() for s in (sources or "").split(",") if s.strip()}
    picked = [(s, n) for s, n in rows if (not kept or s in kept) and (not wanted or n in wanted or f"{s}:{n}" in wanted)]
    known = {n for _, n in rows} | {f"{s}:{n}" for s, n in rows}
    missing = sorted(wanted - known)
    if missing:
        raise SystemExit(f"no such rows: {', '.join(missing)} (expected names such as timm:convnext or "
                         "diffusers:DiTTransformer2DModel)")
    return picked


def compile_stage(recorder, plans: dict, device_mesh, model_file: Path) -> None:
    """The forced plan's step (else the default plan's) compiled whole, against the eager step."""
    if _COMPILE_BACKEND[0] == "none":
        return
    key = next((k for k in ("float32/forced", "float32/default") if k in plans
                and recorder.row["stages"].get(f"apply {k}", {}).get("ok")), None)
    if key is None:
        return
    import torch
    from hf_row import load_row_model

    from autoplan.verify.numerics import without_randomness
    from autoplan.verify.step_check import verify_plan

    with recorder.stage("compile") as info:
        info.update(plan=key, backend=_COMPILE_BACKEND[0])
        torch._dynamo.reset()
        with without_randomness():
            torch.manual_seed(0)
            model, batch, loss_fn = load_row_model(model_file)
            eager = verify_plan(model, batch, plans[key], device_mesh, loss_fn=loss_fn)
            torch.manual_seed(0)
            model, batch, loss_fn = load_row_model(model_file)
            compiled = verify_plan(model, batch, plans[key], device_mesh, loss_fn=loss_fn, compile_mode="whole",
                                   backend=_COMPILE_BACKEND[0])
        error = abs(compiled.loss - eager.loss) / max(abs(eager.loss), 1e-30)
        info.update(eager_loss=eager.loss, compiled_loss=compiled.loss, rel_error=error, collectives=compiled.passed)
        if not compiled.passed:
            raise CompiledCollectivesDiffer("compiled step: observed != predicted collectives")
        if error > COMPILE_TOLERANCE:
            raise CompiledLossDiffers(f"compiled loss differs from eager by more than {COMPILE_TOLERANCE:g}")


class CompiledCollectivesDiffer(Exception):
    pass


class CompiledLossDiffers(Exception):
    pass


def row_main(spec: str, out: Path, dtypes: list[str], numerics: bool, numerics_max_step_s: float) -> None:
    from hf_row import run_source_row
    from vision_models import class_name, model_file_text

    # Planned as ``autoplan suggest`` plans (no process group up): the plan's collectives are
    # its step's, counted on a dry run, which the fake-process-group step is then judged by.
    run_source_row(spec, out, dtypes, numerics, numerics_max_step_s, class_name, model_file_text, compile_stage,
                   plan_outside_group=True)


def passes(row: dict) -> bool:
    """Every stage the row ran passed (a stage it never reached counts as failed only
    where an earlier one failed)."""
    return bool(row["stages"]) and all(info.get("ok") for info in row["stages"].values())


def compile_lines(rows: list[dict]) -> list[str]:
    built = [r for r in rows if stage_ok(r, "build")]
    ran = [r for r in built if "compile" in r["stages"]]
    ok = [r for r in ran if stage_ok(r, "compile")]
    passed = [r for r in built if passes(r)]
    share = len(passed) / len(built) if built else 0.0
    lines = [f"compiled whole ({_COMPILE_BACKEND[0]}), forced plan: {len(ok)}/{len(ran)} of those that ran",
             (f"every stage passed: {len(passed)}/{len(built)} ({100 * share:.0f} %) of the rows built tiny; "
              f"95 % target {'met' if share >= 0.95 else 'NOT met'}")]
    failed = [r for r in ran if not stage_ok(r, "compile")]
    groups: dict[str, list[str]] = {}
    for row in failed:
        groups.setdefault(row["stages"]["compile"]["cause"], []).append(f"{row['task']}:{row['model_type']}")
    for cause, names in sorted(groups.items(), key=lambda item: -len(item[1])):
        lines.append(f"  {len(names):>3} x [compile] {cause}")
        lines.append(f"        {', '.join(names)}")
    return lines


def main(argv=None) -> dict | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compile-backend" in argv:
        at = argv.index("--compile-backend")
        _COMPILE_BACKEND[0] = argv[at + 1]
        del argv[at:at + 2]
    if "--join" in argv:
        at = argv.index("--join")
        parts = []
        while at + 1 < len(argv) and not argv[at + 1].startswith("--"):
            parts.append(Path(argv.pop(at + 1)))
        del argv[at]
        reruns = "--reruns" in argv
        if reruns:
            argv.remove("--reruns")
        args = parse_args(argv, description=__doc__.splitlines()[0], default_json=DEFAULT_JSON, default_dtypes="float32")
        return join_tables(parts, args.json, reruns=reruns)
    sources = None
    if "--sources" in argv:
        at = argv.index("--sources")
        sources = argv[at + 1]
        del argv[at:at + 2]
    args = parse_args(argv, description=__doc__.splitlines()[0], default_json=DEFAULT_JSON, default_dtypes="float32")
    if args.row:
        row_main(args.row, args.row_out, args.dtypes, not args.no_numerics, args.numerics_max_step)
        return None
    from vision_models import registry_rows, versions

    every = registry_rows()
    missing = sorted({s for s, n in every if not n})
    rows_to_run = select_rows([(s, n) for s, n in every if n], args.models, sources)
    if args.list:
        for source, name in rows_to_run:
            print(f"{source}:{name}")
        return None
    keys = run_keys(args.dtypes)
    header = [*["source" if h == "task" else h for h in table_header(keys)][:-1], "compile", "first failure"]
    printer = Printer(header)
    found = versions()
    versions_line = ", ".join(f"{k} {v}" for k, v in found.items())
    printer.line(f"{versions_line}; {len(rows_to_run)} rows, mesh 2x4, {args.jobs} at a time, {args.timeout} s each; "
                 f"compile backend {_COMPILE_BACKEND[0]}", "bold")
    printer.cells(printer.header, "bold")
    # The row processes must hear the backend too: ``run_isolated`` passes the flags it knows.
    import os

    os.environ["AUTOPLAN_VISION_COMPILE_BACKEND"] = _COMPILE_BACKEND[0]
    result = run_rows(rows_to_run, args, keys, printer, found, Path(__file__), cells=vision_row_cells)
    result["not_installed"] = missing
    result["compile_backend"] = _COMPILE_BACKEND[0]
    _summarize_compile(result)
    from hf_coverage import write_json

    write_json(args.json, result)
    printer.summary(summary_lines(result["summary"], what="rows") + result["compile_summary"]
                    + [f"{versions_line}; total {result['seconds']:.0f} s; table in {args.json}"])
    return result


def _summarize_compile(result: dict) -> None:
    """The table's compile and every-stage lines (``compile_summary``), as the summary prints them."""
    _COMPILE_BACKEND[0] = result.get("compile_backend", _COMPILE_BACKEND[0])
    result["summary"]["every_stage_passed"] = sum(1 for r in result["rows"] if stage_ok(r, "build") and passes(r))
    lines = compile_lines(result["rows"])
    if result.get("not_installed"):
        lines.append(f"not installed here (rows not run): {', '.join(result['not_installed'])}")
    result["compile_summary"] = lines


def join_tables(parts: list[Path], out: Path, reruns: bool = False) -> dict:
    """One table of the rows of ``parts`` (runs over disjoint rows, on the same versions),
    summarized as one run would be, written to ``out``. A run stopped early gives the rows it
    finished (each row's record is written whole when it ends); ``parts`` says which stopped.
    With ``reruns``, a row in a later part replaces the same row of an earlier one (a row run
    again, after a fix); ``parts`` lists the rows each part replaced."""
    import json

    from hf_coverage import _summarize_shapes, write_json

    tables = [json.loads(path.read_text()) for path in parts]
    if not tables:
        raise SystemExit("--join needs the JSON tables of the runs to join")
    if any(t["versions"] != tables[0]["versions"] for t in tables):
        raise SystemExit("--join: the tables come from different library versions; fix: join runs of one environment")
    names = [(r["task"], r["model_type"]) for t in tables for r in t["rows"]]
    if len(names) != len(set(names)) and not reruns:
        raise SystemExit("--join: a row appears in two tables; fix: join runs over disjoint rows (--sources), "
                         "or pass --reruns where a later table ran rows again")
    rows: dict[tuple[str, str], dict] = {}
    replaced: list[list[str]] = []
    for table in tables:
        replaced.append([f"{r['task']}:{r['model_type']}" for r in table["rows"] if (r["task"], r["model_type"]) in rows])
        for row in table["rows"]:
            rows.pop((row["task"], row["model_type"]), None)  # a rerun goes where it ran, after the others
            rows[(row["task"], row["model_type"])] = row
    result = {**tables[0], "rows": list(rows.values()),
              "parts": [{"args": t["args"], "rows": len(t["rows"]), "finished": t.get("finished", True),
                         "seconds": t.get("seconds"), **({"replaced": r} if r else {})}
                        for t, r in zip(tables, replaced)],
              "seconds": round(sum(t.get("seconds") or 0 for t in tables), 1)}
    installed = {s for t in tables for s in {r["task"] for r in t["rows"]}}
    result["not_installed"] = sorted({s for t in tables for s in t.get("not_installed", [])} - installed)
    _summarize_shapes(result, [None], run_keys(result["args"]["dtypes"]), finished=True)
    _summarize_compile(result)
    write_json(out, result)
    for line in summary_lines(result["summary"], what="rows") + result["compile_summary"]:
        print(line)
    print(f"{len(result['rows'])} rows from {len(parts)} runs; table in {out}")
    return result


def _compile_mark(row: dict) -> str:
    ok = stage_ok(row, "compile")
    return "·" if ok is None else "✓" if ok else "✗"


def vision_row_cells(row: dict, keys: list[str], dtypes: list[str]) -> list[str]:
    cells = row_cells(row, keys, dtypes)
    cause = cells[-1] or (f"compile: {row['stages']['compile']['cause']}" if stage_ok(row, "compile") is False else "")
    return [*cells[:-1], _compile_mark(row), cause[:110]]


if __name__ == "__main__":
    import os

    _COMPILE_BACKEND[0] = os.environ.get("AUTOPLAN_VISION_COMPILE_BACKEND", _COMPILE_BACKEND[0])
    main()
