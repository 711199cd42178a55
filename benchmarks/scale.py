"""Planning at scale: Llama-3 8B / 70B / 405B shapes on 64 and 128 ranks, on this machine.

    python benchmarks/scale.py [--time-limit 60] [--cases 8b:8x8,70b:8x8] [--skip-tying]

Per case it runs the whole ``autoplan suggest`` command in a subprocess (process start to
plan written: imports, model built on meta, trace, choices, cost, simplify, solve, plan)
and prints its wall time, peak RSS, the in-process stage times, graph nodes, decisions
before and after merging followers and tying, ILP variables, objective and gap (read
back from the command's ``--stats`` file). Then it plans the 8B cut to 8 layers on 2x4 with
and without tying identical layers and prints the objective difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILE = "examples/llama3.py"
BUILDERS = {"8b": "build_model", "70b": "make_70b", "405b": "make_405b"}
CASES = ("8b:2x4", "8b:8x8", "8b:4x4x4", "70b:2x4", "70b:8x8", "70b:4x4x4", "405b:8x16")
GIB = 2**30


def run_suggest(size: str, mesh: str, time_limit: float | None, tie: bool = True) -> dict:
    """One whole ``autoplan suggest`` command: wall time, peak RSS and its stats file."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "autoplan", "suggest", f"{MODEL_FILE}:{BUILDERS[size]}", "--mesh", mesh,
                   "--out", f"{tmp}/plan.json", "--stats", f"{tmp}/stats.json"]
        if time_limit:
            command += ["--time-limit", str(time_limit)]
        if not tie:
            command.append("--no-tie")
        started = time.perf_counter()
        # An empty plan cache of its own: the command really plans (and pays for storing the plan).
        env = {**os.environ, "AUTOPLAN_CACHE_DIR": f"{tmp}/cache"}
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _out, err = process.communicate()
        wall = time.perf_counter() - started
        if process.returncode != 0:
            return {"error": (err.strip().splitlines() or ["?"])[-1], "wall_s": wall}
        stats = json.loads(Path(f"{tmp}/stats.json").read_text())
    stats["wall_s"] = wall
    return stats


def tying_difference(time_limit: float | None, progress) -> dict:
    """The 8B cut to 8 layers on 2x4, planned tied and untied, in this process."""
    from autoplan.model_file import load_model_file
    from autoplan.pipeline.suggest import suggest_with_report

    found = {}
    for tie in (True, False):
        label = f"8b, 8 layers, 2x4, {'tied' if tie else 'untied'}"
        progress.started(label)
        loaded = load_model_file(f"{ROOT / MODEL_FILE}:make_8b_8layers")
        started = time.perf_counter()
        plan, report = suggest_with_report(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), time_limit_s=time_limit, tie=tie)
        found[tie] = (plan, report, time.perf_counter() - started)
        progress.finished(label)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=None, help="solver time limit per case (s)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated SIZE:MESH, e.g. 70b:8x8")
    parser.add_argument("--skip-tying", action="store_true", help="skip the tied-vs-untied comparison")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from autoplan.explain.progress import rows_on_stderr

    cases = args.cases.split(",")
    with rows_on_stderr(len(cases) + (0 if args.skip_tying else 2), "plans") as progress:
        run_cases(cases, args.time_limit, progress)
        if not args.skip_tying:
            found = tying_difference(args.time_limit, progress)
    if not args.skip_tying:
        print_tying(found)
    return 0


def run_cases(cases: list[str], time_limit: float | None, progress) -> None:
    """Each case's whole ``suggest`` command, one row printed per case."""
    print(f"{'model':<6} {'mesh':<7} {'command s':>9} {'trace':>6} {'choices':>7} {'cost':>6} {'simplify':>8} {'solve':>6} "
          f"{'plan':>5} {'nodes':>6} {'decisions':>9} {'merged+tied':>11} {'variables':>9} {'objective s':>11} {'gap':>7} "
          f"{'status':>8} {'peak RSS GiB':>12}")
    for case in cases:
        size, mesh = case.split(":")
        progress.started(case)
        stats = run_suggest(size, mesh, time_limit)
        progress.finished(case)
        if "error" in stats:
            print(f"{size:<6} {mesh:<7} {stats['wall_s']:>9.2f}  error: {stats['error']}")
            continue
        st, solver = stats["stage_seconds"], stats["solver"]
        print(f"{size:<6} {mesh:<7} {stats['wall_s']:>9.2f} {st['trace']:>6.2f} {st['choices']:>7.2f} {st['cost']:>6.2f} "
              f"{st['simplify']:>8.2f} {st['solve']:>6.2f} {st['plan']:>5.2f} {stats['graph_nodes']:>6} {stats['decisions']:>9} "
              f"{stats['decisions_after_merge']:>11} {stats['variables']:>9} {solver['objective_s']:>11.6g} {solver['gap']:>7.2%} "
              f"{solver['status']:>8} {stats['peak_rss_bytes'] / GIB:>12.2f}", flush=True)


def print_tying(found: dict) -> None:
    tied, untied = found[True][0].solver, found[False][0].solver
    print("\nLlama-3-8B shapes cut to 8 layers, mesh 2x4: tied vs untied")
    for tie, label in ((True, "tied"), (False, "untied")):
        plan, report, wall = found[tie]
        print(f"  {label:<7} objective {plan.solver.objective:.6g} s ({plan.solver.status}, gap {plan.solver.gap:.2%}), "
              f"{report.variables} variables, {wall:.2f} s in process")
    difference = (tied.objective - untied.objective) / untied.objective
    same = found[True][0].parameters == found[False][0].parameters and found[True][0].modules == found[False][0].modules
    print(f"  tying costs {difference:+.4%} of the untied objective; plans identical: {same}")


if __name__ == "__main__":
    raise SystemExit(main())
