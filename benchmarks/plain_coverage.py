"""Models written in plain PyTorch: how many of torchtitan's and litgpt's models autoplan plans and runs.

The plain-PyTorch part of the coverage benchmark (``hf_coverage.py`` is the HuggingFace
part; the row stages, table and summary are its own, imported). Rows (``plain_models.py``):
every language-model family in torchtitan's model registry (``debugmodel`` flavour, cut to
2 layers; as shipped and with torchtitan's SDPA attention), a handful of litgpt
architectures (``Config.from_name``, sizes shrunk) and the nanoGPT-style GPT of
``tests/models/nanogpt.py``. Each row runs in its own process with a timeout through the
stages of ``hf_row.py``: built and stepped on one CPU, planned on 2x4 with the default
budget and with the forced budget that shards weights on both axes, applied on a fake
process group of 8 with one step (forward, backward, AdamW), collectives equal to the
prediction, and loss and gradients on 8 gloo processes against one device (within 1e-5)
where the float32 step took at most ``--numerics-max-step`` seconds.

    python benchmarks/plain_coverage.py [--models llama3,litgpt:phi-2,...] [--jobs N]
                                        [--dtypes float32,bfloat16] [--no-numerics] [--list]
                                        [--timeout 1800] [--json benchmarks/results/plain_coverage.json]

torchtitan and litgpt are installed with ``pip install --no-deps`` (their requirements would
pull another torch); docs/models.md ("Measuring it") says what else to add by hand.
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
    run_keys,
    run_rows,
    summary_lines,
    table_header,
)

DEFAULT_JSON = BENCH_DIR / "results" / "plain_coverage.json"


def select_rows(rows, models: str | None) -> list[tuple[str, str]]:
    """``--models a,source:b``: a name in any source, or one source's."""
    wanted = {m.strip() for m in (models or "").split(",") if m.strip()}
    if not wanted:
        return list(rows)
    picked = [(s, n) for s, n in rows if n in wanted or f"{s}:{n}" in wanted]
    known = {n for _, n in rows} | {f"{s}:{n}" for s, n in rows}
    missing = sorted(wanted - known)
    if missing:
        raise SystemExit(f"no such rows: {', '.join(missing)} (expected names such as llama3, llama3+sdpa or litgpt:phi-2)")
    return picked


def row_main(spec: str, out: Path, dtypes: list[str], numerics: bool, numerics_max_step_s: float) -> None:
    from hf_row import run_source_row
    from plain_models import class_name, model_file_text

    run_source_row(spec, out, dtypes, numerics, numerics_max_step_s, class_name, model_file_text)


def main(argv=None) -> dict | None:
    args = parse_args(argv, description=__doc__.splitlines()[0], default_json=DEFAULT_JSON, default_dtypes="float32")
    if args.row:
        row_main(args.row, args.row_out, args.dtypes, not args.no_numerics, args.numerics_max_step)
        return None
    from plain_models import registry_rows, versions

    rows_to_run = select_rows(registry_rows(), args.models)
    if args.list:
        for source, name in rows_to_run:
            print(f"{source}:{name}")
        return None
    keys = run_keys(args.dtypes)
    printer = Printer(run_header(keys))
    found = versions()
    versions_line = ", ".join(f"{k} {v}" for k, v in found.items())
    printer.line(f"{versions_line}; {len(rows_to_run)} rows, mesh 2x4, "
                 f"{args.jobs} at a time, {args.timeout} s each", "bold")
    printer.cells(printer.header, "bold")
    result = run_rows(rows_to_run, args, keys, printer, found, Path(__file__))
    printer.summary(summary_lines(result["summary"], what="rows")
                    + [f"{versions_line}; total {result['seconds']:.0f} s; table in {args.json}"])
    return result


def run_header(keys: list[str]) -> list[str]:
    return ["source" if h == "task" else h for h in table_header(keys)]


if __name__ == "__main__":
    main()
