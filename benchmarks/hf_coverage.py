"""Models as people write them: how many of transformers' own architectures autoplan plans and runs.

Rows are every (task, model_type) in transformers' auto-model registries for causal LM,
masked LM, seq2seq LM and image classification. Each is built tiny from its shipped config
(only sizes changed: ``hf_tiny.py`` has the one shrinking function and its table of knobs)
and taken through the stages of ``hf_row.py``, in its own process with a timeout:

    built -> planned (2x4, dp x tp; plan seconds printed) -> applied (fake process group of 8:
    forward, backward, AdamW step) -> collectives as predicted (``plan.predicted``)

at each batch shape of ``--shapes`` (examples x tokens; by default ``SHAPES``: the batch of
8 x 16 that divides every axis, 4 x 64 with fewer examples than devices, and 6 x 15 whose
examples divide one axis only and whose tokens divide none), as separate runs of the row,
once with the default memory budget and once with a budget that forces weights to shard on
every mesh axis (the forced plan's share of parameter bytes split on both axes is checked),
in float32 and in bfloat16 (the model cast with ``.to``, token ids unchanged), then gloo
numerics (loss and gradients of both float32 plans against one device, within 1e-5) where
the float32 step ran within ``--numerics-max-step`` seconds. ``--widths real`` keeps the
configs' shipped sizes but for 2 layers (``hf_tiny.few_layers_config``): nothing is made
but the batch (built on meta, each step on the plan's fake twin as ``autoplan verify``
counts it), and no numerics run.

It prints one row per architecture as it completes (marks: plan, apply, collectives, and
for forced budgets the every-axis check; ✓ passed, ✗ failed, · not reached), then a
summary per batch shape: counts and shares per stage, failures grouped by cause. The table goes to
``--json`` (rewritten after each row, atomically). Nothing is cached across rows; a row that
fails, crashes or hangs never stops the run.

    python benchmarks/hf_coverage.py                       # every architecture (hours)
    python benchmarks/hf_coverage.py --quick               # 12 well-known ones
    python benchmarks/hf_coverage.py --shapes 8x16         # one batch shape (the one before shapes)
    python benchmarks/hf_coverage.py --widths real --models llama,t5 --dtypes float32
    python benchmarks/hf_coverage.py --models vit,convnext,causal_lm:llama --jobs 2
                                     [--tasks causal_lm,...] [--dtypes float32] [--no-numerics] [--build-only] [--list]
                                     [--timeout 1800] [--json benchmarks/results/hf_coverage.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from hf_tiny import TASKS  # noqa: E402

QUICK = ("llama", "qwen2", "mixtral", "gpt_neox", "t5", "bart", "bert", "gpt2", "vit", "phi", "opt", "qwen2_moe")
TASK_TAGS = {"causal_lm": "clm", "masked_lm": "mlm", "seq2seq_lm": "s2s", "image_classification": "img"}
TARGET_SHARE = 0.95
DEFAULT_JSON = BENCH_DIR / "results" / "hf_coverage.json"
RUN_STAGES = ("plan", "apply", "collectives")
DEFAULT_SHAPE = "8x16"
SHAPES = {
    DEFAULT_SHAPE: "hf_tiny's batch: 8 examples divide every axis",
    "4x64": "fewer examples than the mesh's 8 devices",
    "6x15": "6 examples divide dp (2) but not tp (4) nor the mesh; 15 tokens divide no axis",
}
"""The batch shapes (examples x tokens) each row runs at by default."""


def registry_rows(tasks=tuple(TASKS)) -> list[tuple[str, str]]:
    """(task, model_type) for every architecture the auto registries name, in their order."""
    from transformers.models.auto import modeling_auto

    return [(task, model_type) for task in tasks for model_type in getattr(modeling_auto, TASKS[task][0])]


def select_rows(rows, models: str | None, quick: bool) -> list[tuple[str, str]]:
    """``--models a,b,task:c`` (a model type in every task that has it), or ``--quick``."""
    wanted = set(QUICK) if quick and not models else {m.strip() for m in (models or "").split(",") if m.strip()}
    if not wanted:
        return list(rows)
    picked = [(t, m) for t, m in rows if m in wanted or f"{t}:{m}" in wanted]
    known = {m for _, m in rows} | {f"{t}:{m}" for t, m in rows}
    missing = sorted(wanted - known)
    if missing:
        raise SystemExit(f"not in the registries: {', '.join(missing)} (expected model types such as llama or task:model_type)")
    return picked


def run_keys(dtypes: list[str]) -> list[str]:
    return [f"{dtype}/{budget}" for dtype in dtypes for budget in ("default", "forced")]


# ---- one row in a subprocess --------------------------------------------------------------

def run_isolated(task: str, model_type: str, args, workdir: Path, script: Path = Path(__file__),
                 shape: str | None = None) -> dict:
    """The row from ``script --row`` in a fresh process (own session, so a timeout kills its
    gloo children too); a crash or timeout is recorded on the stage that was running.
    ``shape`` ("4x64": batch x sequence) is the batch's, where the rows take one."""
    name = f"{task}-{model_type}" + (f"-{shape}" if shape else "")
    out = workdir / f"{name}.json"
    log = workdir / f"{name}.log"
    command = [sys.executable, str(script.resolve()), "--row", f"{task}:{model_type}", "--row-out", str(out),
               "--dtypes", ",".join(args.dtypes) or "none", "--numerics-max-step", str(args.numerics_max_step)]
    if args.no_numerics:
        command.append("--no-numerics")
    if shape:
        command += ["--shapes", shape, "--widths", args.widths]
    started = time.perf_counter()
    with open(log, "w") as stderr:
        proc = subprocess.Popen(command, stdout=stderr, stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(proc)
        try:
            code = proc.wait(timeout=args.timeout)
            ending = None if code == 0 else f"crashed (exit code {code})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ending = f"timeout after {args.timeout} s"
        finally:
            _LIVE.discard(proc)
    row = json.loads(out.read_text()) if out.exists() else {"task": task, "model_type": model_type, "class": "", "stages": {}}
    if shape:
        row["shape"] = shape
    if ending:
        _mark_ending(row, ending, log)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


_LIVE: set = set()
"""Row processes now running: in sessions of their own, so Ctrl-C does not reach them."""


def _stop_live_rows() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _mark_ending(row: dict, ending: str, log: Path) -> None:
    stages = row["stages"]
    if not stages:
        stages["build"] = {"ok": False, "cause": "running", "seconds": None}
    for name, info in list(stages.items()):
        if info.get("cause") != "running":
            continue
        info["cause"] = ending
        if name == "numerics launch":  # the jobs it was running fail with it
            for key in info.get("jobs", []):
                stages[f"numerics {key}"] = {"ok": False, "cause": ending, "seconds": None}
    row["log_tail"] = log.read_text(errors="replace")[-3000:]


def row_main(spec: str, out: Path, dtypes: list[str], numerics: bool, numerics_max_step_s: float,
             shape: str | None = None, widths: str = "tiny") -> None:
    import torch
    from hf_row import class_name, hf_model_file_text, run_row

    torch.set_num_threads(1)  # rows run side by side on few cores
    task, model_type = spec.split(":", 1)
    model_file = out.with_suffix(".model.py")  # beside the row's JSON, in the run's temporary folder
    model_file.write_text(hf_model_file_text(task, model_type, parse_shape(shape) if shape else None, widths))
    row = {"task": task, "model_type": model_type, "class": class_name(task, model_type)}
    if shape:
        row["shape"] = shape
    run_row(row, model_file, dtypes, numerics, numerics_max_step_s, out, fake=widths == "real")


def parse_shape(text: str) -> tuple[int, int]:
    """"4x64" -> (4, 64): examples in the global batch, tokens per example."""
    batch, _, seq = text.partition("x")
    if not (batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
        raise SystemExit(f"expected a batch shape such as 4x64 (examples x tokens), got {text!r}")
    return int(batch), int(seq)


# ---- table and summary ---------------------------------------------------------------------

def task_tag(task: str) -> str:
    return TASK_TAGS.get(task, task)


def row_label(task: str, model_type: str, shape: str | None = None) -> str:
    return f"{model_type}[{task_tag(task)}]" + (f" {shape}" if shape else "")


def stage_ok(row: dict, name: str) -> bool | None:
    """True / False where the stage ran, None where it was not reached."""
    info = row["stages"].get(name)
    return None if info is None else bool(info["ok"])


def run_marks(row: dict, key: str) -> str:
    marks = [stage_ok(row, f"{stage} {key}") for stage in RUN_STAGES]
    if key.endswith("forced"):
        plan = row["stages"].get(f"plan {key}", {})
        marks.append(plan.get("sharded_every_axis") if plan.get("ok") else None)
    return "".join("·" if m is None else "✓" if m else "✗" for m in marks)


def numerics_marks(row: dict, dtypes: list[str]) -> str:
    if "float32" not in dtypes:
        return "-"
    marks = [stage_ok(row, f"numerics float32/{b}") for b in ("default", "forced")]
    return "".join("·" if m is None else "✓" if m else "✗" for m in marks)


def row_cells(row: dict, keys: list[str], dtypes: list[str]) -> list[str]:
    build = stage_ok(row, "build")
    plan_s = [row["stages"].get(f"plan {k}", {}).get("plan_seconds") for k in keys]
    return [
        row["model_type"] + (f" {row['shape']}" if row.get("shape") else ""), task_tag(row["task"]), "✓" if build else "✗",
        *[run_marks(row, k) for k in keys], numerics_marks(row, dtypes),
        " ".join("-" if s is None else f"{s:.1f}" for s in plan_s), f"{row.get('seconds', 0):.0f}",
        _first_cause(row, keys)[:110],
    ]


def table_header(keys: list[str]) -> list[str]:
    short = {"float32": "f32", "bfloat16": "bf16"}
    runs = [f"{short[k.split('/')[0]]} {k.split('/')[1][:3]}" for k in keys]
    return ["model_type", "task", "built", *runs, "numerics", "plan s", "row s", "first failure"]


def _first_cause(row: dict, keys: list[str]) -> str:
    for stage, cause in failures_of(row, keys):
        mismatches = row["stages"].get(stage, {}).get("mismatches")
        kinds = f" on {', '.join(sorted({m['axis'] + ' ' + m['kind'] for m in mismatches}))}" if mismatches else ""
        return f"{stage}: {cause}{kinds}"
    return ""


def failures_of(row: dict, keys: list[str]) -> list[tuple[str, str]]:
    """(stage, cause) of the first failing stage of each run of the row (and of numerics)."""
    stages = row["stages"]
    if not stage_ok(row, "build"):
        return [("build", stages.get("build", {}).get("cause") or "not built")]
    found = []
    for key in keys:
        dtype = key.split("/")[0]
        build = stages.get(f"build {dtype}")
        if build is not None and not build["ok"]:
            if (f"build {dtype}", build["cause"]) not in found:
                found.append((f"build {dtype}", build["cause"]))
            continue
        for stage in RUN_STAGES:
            info = stages.get(f"{stage} {key}")
            if info is not None and not info["ok"]:
                found.append((f"{stage} {key}", info["cause"]))
                break
    for key in ("float32/default", "float32/forced"):
        info = stages.get(f"numerics {key}")
        if info is not None and not info["ok"]:
            found.append((f"numerics {key}", info["cause"]))
    return found


def summarize(rows: list[dict], keys: list[str]) -> dict:
    built = [r for r in rows if stage_ok(r, "build")]
    runs = {}
    for key in keys:
        ran = built_in(built, key.split("/")[0])
        counts = {"built": len(ran), **{stage: sum(1 for r in ran if stage_ok(r, f"{stage} {key}")) for stage in RUN_STAGES}}
        if key.endswith("forced"):
            counts["sharded_every_axis"] = sum(
                1 for r in ran if r["stages"].get(f"plan {key}", {}).get("sharded_every_axis")
            )
        seconds = [r["stages"][f"plan {key}"]["plan_seconds"] for r in ran
                   if stage_ok(r, f"plan {key}") and "plan_seconds" in r["stages"][f"plan {key}"]]
        counts["plan_seconds_median"] = round(statistics.median(seconds), 2) if seconds else None
        counts["plan_seconds_max"] = round(max(seconds), 2) if seconds else None
        runs[key] = counts
    numerics = {}
    for key in ("float32/default", "float32/forced"):
        ran = [r for r in built if stage_ok(r, f"numerics {key}") is not None]
        numerics[key] = {"ran": len(ran), "ok": sum(1 for r in ran if stage_ok(r, f"numerics {key}"))}
    groups: dict[str, dict] = {}
    for row in rows:
        for stage, cause in failures_of(row, keys):
            group = groups.setdefault(cause, {"cause": cause, "stages": set(), "models": set()})
            group["stages"].add(stage)
            group["models"].add(row_label(row["task"], row["model_type"]))
    failures = sorted(
        ({"cause": g["cause"], "stages": sorted(g["stages"]), "models": sorted(g["models"])} for g in groups.values()),
        key=lambda g: (-len(g["models"]), g["cause"]),
    )
    return {"rows": len(rows), "built": len(built), "runs": runs, "numerics": numerics, "failures": failures}


def built_in(built: list[dict], dtype: str) -> list[dict]:
    """The built rows that also train in ``dtype`` on one device: a row whose bfloat16 build
    failed (a kernel without bfloat16 on the CPU, a model that mixes dtypes by hand) has no
    bfloat16 runs, and is listed under that cause instead."""
    return [r for r in built if stage_ok(r, f"build {dtype}") is not False]


def summary_lines(summary: dict, what: str = "the registries' rows") -> list[str]:
    built = summary["built"]
    pct = lambda n, d: f"{n}/{d} ({100 * n / d:.0f} %)" if d else f"{n}/0"  # noqa: E731
    lines = [f"built tiny: {pct(built, summary['rows'])} of {what}"]
    for key, counts in summary["runs"].items():
        ran = counts.get("built", built)  # JSON written before per-dtype builds: every built row
        parts = [f"{stage} {pct(counts[stage], ran)}" for stage in ("plan", "apply", "collectives")]
        if "sharded_every_axis" in counts:
            parts.append(f"weights split on every axis {pct(counts['sharded_every_axis'], ran)}")
        if ran != built:
            parts.insert(0, f"built in {key.split('/')[0]} {pct(ran, built)}")
        target = "met" if ran and counts["collectives"] >= TARGET_SHARE * ran else "NOT met"
        timing = f"plan s median {counts['plan_seconds_median']}, max {counts['plan_seconds_max']}"
        lines.append(f"{key:<17} " + ", ".join(parts) + f"; {timing}; 95 % target {target}")
    for key, counts in summary["numerics"].items():
        lines.append(f"numerics {key:<17} within 1e-5: {pct(counts['ok'], counts['ran'])} of those that ran")
    lines.append("failures by cause (first failing stage of each run):")
    for group in summary["failures"]:
        lines.append(f"  {len(group['models']):>3} x [{_short_stages(group['stages'])}] {group['cause']}")
        lines.append(f"        {', '.join(group['models'])}")
    return lines


def _short_stages(stages: list[str]) -> str:
    """["plan float32/default", "plan bfloat16/default"] -> "plan f32/def bf16/def"."""
    runs: dict[str, list[str]] = {}
    for stage in stages:
        kind, _, key = stage.partition(" ")
        runs.setdefault(kind, [])
        if key:  # "float32/default", or a dtype alone ("build bfloat16")
            dtype, _, budget = key.partition("/")
            short = "f32" if dtype == "float32" else "bf16"
            runs[kind].append(f"{short}/{budget[:3]}" if budget else short)
    return "; ".join(" ".join([kind, *keys]) for kind, keys in runs.items())


class Printer:
    """Rows as they complete and the summary: with ``rich`` where installed, else plain text."""

    def __init__(self, header: list[str]):
        self.header = header
        self.widths = [22, 10] + [max(len(h), 4) for h in header[2:-1]] + [0]
        try:
            from rich.console import Console

            self.console = Console(highlight=False)
        except ImportError:
            self.console = None

    def line(self, text: str, style: str | None = None) -> None:
        if self.console is None:
            print(text, flush=True)
            return
        # Rendered here, written through sys.stdout: while the progress bar is up, that is
        # the bar's proxy, which prints the line above the bar (a rich console would write
        # past the proxy, onto the bar's line).
        with self.console.capture() as captured:
            self.console.print(text, style=style, markup=False, soft_wrap=True)
        sys.stdout.write(captured.get())
        sys.stdout.flush()

    def cells(self, cells: list[str], style: str | None = None) -> None:
        self.line("  ".join(c.ljust(w) for c, w in zip(cells, self.widths)).rstrip(), style)

    def row(self, cells: list[str], failed: bool) -> None:
        self.cells(cells, "red" if failed else "green")

    def summary(self, lines: list[str]) -> None:
        self.line("")
        for text in lines:
            self.line(text, "bold" if not text.startswith(" ") else None)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def parse_args(argv=None, description: str | None = None, default_json: Path = DEFAULT_JSON,
               default_dtypes: str = "float32,bfloat16"):
    """The flags of this benchmark; ``plain_coverage.py`` passes its own description, table
    path and dtypes and gets the same flags but the HuggingFace registry's ``--quick``/``--tasks``."""
    hf = description is None
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated model types (or task:model_type); default every row")
    if hf:
        parser.add_argument("--quick", action="store_true", help="12 well-known architectures: " + ",".join(QUICK))
        parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, of " + ",".join(TASKS))
    if hf:
        parser.add_argument("--shapes", default=",".join(SHAPES),
                            help="comma-separated batch shapes, examples x tokens, each row run at each (image rows: the "
                                 "examples; their images keep the config's size); default: " + ", ".join(
                                     f"{k} ({v})" for k, v in SHAPES.items()))
        parser.add_argument("--widths", choices=("tiny", "real"), default="tiny",
                            help="tiny: sizes shrunk (hf_tiny.py); real: the configs' shipped widths, 2 layers "
                                 "(no weights made: built on meta, each step on its fake twin, no numerics)")
    parser.add_argument("--jobs", type=int, default=1, help="rows run at once")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per row")
    parser.add_argument("--dtypes", default=default_dtypes)
    parser.add_argument("--no-numerics", action="store_true", help="skip the gloo numerics")
    parser.add_argument("--build-only", action="store_true", help="only build each tiny model and step it on one device")
    parser.add_argument("--list", action="store_true", help="print the selected rows, per task, and exit")
    parser.add_argument("--numerics-max-step", type=float, default=20.0,
                        help="numerics only where the float32 fake-process-group step took at most this many seconds")
    parser.add_argument("--json", type=Path, default=default_json)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.dtypes = [] if args.build_only else [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.dtypes = [d for d in args.dtypes if d != "none"]  # how a row hears --build-only
    if hf:
        args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
        for shape in args.shapes:
            parse_shape(shape)
    else:  # plain models make their own batch
        args.shapes, args.widths = [None], "tiny"
    unknown = [d for d in args.dtypes if d not in ("float32", "bfloat16")]
    if unknown:
        parser.error(f"expected dtypes float32 and/or bfloat16, got {', '.join(unknown)}")
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.row:
        shape = args.shapes[0] if len(args.shapes) == 1 else DEFAULT_SHAPE
        row_main(args.row, args.row_out, args.dtypes, not args.no_numerics, args.numerics_max_step, shape, args.widths)
        return None
    import torch
    import transformers

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    rows_to_run = select_rows(registry_rows(tasks), args.models, args.quick)
    if args.list:
        for task in tasks:
            names = [m for t, m in rows_to_run if t == task]
            print(f"{task} ({len(names)}): {', '.join(names)}")
        return None
    keys = run_keys(args.dtypes)
    printer = Printer(table_header(keys))
    printer.line(f"transformers {transformers.__version__}, torch {torch.__version__}; {len(rows_to_run)} rows "
                 f"at {args.widths} widths, batch shapes {', '.join(args.shapes)}; mesh 2x4, {args.jobs} at a time, "
                 f"{args.timeout} s each", "bold")
    printer.cells(printer.header, "bold")
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    result = run_rows(rows_to_run, args, keys, printer, versions, Path(__file__))
    lines = []
    for shape, summary in result.get("shapes", {None: result["summary"]}).items():
        lines += [f"batch {shape}:" if shape else "", *summary_lines(summary)]
    printer.summary(lines + [f"total {result['seconds']:.0f} s; table in {args.json}"])
    return result


def run_rows(rows_to_run, args, keys: list[str], printer, versions: dict, script: Path, cells=None) -> dict:
    """Each row in its own process (``script --row``), ``args.jobs`` at a time; rows printed
    (``cells(row, keys, dtypes)``, default ``row_cells``) and the JSON table rewritten as they
    complete, then in the given order with a summary."""
    cells = cells or row_cells
    from autoplan.explain.progress import rows_on_stderr

    result = {"versions": versions, "args": {k: v for k, v in vars(args).items() if not k.startswith("row")}, "rows": []}
    shapes = getattr(args, "shapes", [None])
    runs = [(task, name, shape) for task, name in rows_to_run for shape in shapes]
    started = time.perf_counter()
    with (tempfile.TemporaryDirectory(prefix=f"{script.stem}-") as tmp, ThreadPoolExecutor(args.jobs) as pool,
          rows_on_stderr(len(runs)) as progress):

        def run_one(task: str, name: str, shape: str | None) -> dict:
            progress.started(row_label(task, name, shape))
            return run_isolated(task, name, args, Path(tmp), script, shape)

        futures = [pool.submit(run_one, *run) for run in runs]
        try:
            for future in as_completed(futures):
                row = future.result()
                result["rows"].append(row)
                printer.row(cells(row, keys, args.dtypes), failed=bool(failures_of(row, keys)))
                progress.finished(row_label(row["task"], row["model_type"], row.get("shape")))
                _summarize_shapes(result, shapes, keys, finished=False)  # a run stopped early still tells
                write_json(args.json, result)
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            _stop_live_rows()
            raise
    order = {key: i for i, key in enumerate(runs)}
    result["rows"].sort(key=lambda r: order[(r["task"], r["model_type"], r.get("shape"))])
    _summarize_shapes(result, shapes, keys, finished=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_json(args.json, result)
    return result


def _summarize_shapes(result: dict, shapes: list, keys: list[str], finished: bool) -> None:
    """One summary per batch shape; "summary" is the first shape's (the only one where rows
    take none). Until the run has finished (``finished`` false), of the rows done at every shape."""
    rows = result["rows"]
    if not finished:
        done = [{(r["task"], r["model_type"]) for r in rows if r.get("shape") == shape} for shape in shapes]
        rows = [r for r in rows if all((r["task"], r["model_type"]) in d for d in done)]
    summaries = {shape: summarize([r for r in rows if r.get("shape") == shape], keys) for shape in shapes}
    result["summary"] = summaries[shapes[0]]
    if shapes != [None]:  # plain models make their own batch: one summary, no shapes
        result["shapes"] = summaries
    result["finished"] = finished


if __name__ == "__main__":
    main()
