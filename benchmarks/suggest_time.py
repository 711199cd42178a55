"""Wall time of `autoplan suggest` on the shipped Llama examples, split by stage.

    python benchmarks/suggest_time.py [--mesh 2x4]

Prints, per model: whole command wall time (process start to plan written, measured
around a subprocess), the in-process stage split, graph nodes, decisions before/after
merging followers, and ILP variables.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("examples/llama.py", "examples/llama_7b.py")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="2x4")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from autoplan.explain.progress import rows_on_stderr
    from autoplan.model_file import parse_axis_names, parse_mesh

    mesh = parse_mesh(args.mesh)
    print(f"{'model':<22} {'command s':>9} {'trace':>6} {'choices':>7} {'cost':>6} {'simplify':>8} {'solve':>6} "
          f"{'nodes':>6} {'decisions':>9} {'merged':>6} {'variables':>9} {'step ms':>8}")
    with rows_on_stderr(len(MODELS), "models") as progress:
        for model in MODELS:
            progress.started(model)
            print_row(model, args.mesh, mesh, parse_axis_names(None, mesh))
            progress.finished(model)
    return 0


def print_row(model: str, mesh_text: str, mesh: tuple[int, ...], axis_names: tuple[str, ...]) -> None:
    """The whole command timed in a subprocess, then the stages of the same planning in this one."""
    from autoplan.model_file import load_model_file
    from autoplan.pipeline.suggest import suggest_with_report

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoplan", "suggest", model, "--mesh", mesh_text, "--out", f"{tmp}/plan.json"],
                       cwd=ROOT, check=True, capture_output=True,
                       env={**os.environ, "AUTOPLAN_CACHE_DIR": f"{tmp}/cache"})  # cold: an empty plan cache
        command_s = time.perf_counter() - started
    loaded = load_model_file(str(ROOT / model))
    plan, report = suggest_with_report(loaded.model, loaded.example_inputs, mesh, axis_names)
    st = report.stage_seconds
    print(f"{Path(model).stem:<22} {command_s:>9.2f} {st['trace']:>6.2f} {st['choices']:>7.2f} {st['cost']:>6.2f} "
          f"{st['simplify']:>8.2f} {st['solve']:>6.2f} {report.graph_nodes:>6} {report.decisions:>9} "
          f"{report.decisions_after_merge:>6} {report.variables:>9} {plan.predicted.step_time_s * 1e3:>8.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
