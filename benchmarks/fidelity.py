"""Does the cost model rank plans the way reality does? Predicted vs measured step time.

    python benchmarks/fidelity.py [--models mlp,cnn,transformer,gpt2,bert,llama,moe]
                                  [--profile cpu-gloo] [--random 6] [--min-plans 10] [--seed 0]
                                  [--steps 7] [--warmup 2] [--budget-s 5] [--out benchmarks/results]
                                  [--predict-only] [--compile none|block|whole] [--pipeline]

For each public-zoo model (the small ``build_model`` config of ``examples/NAME.py``) on a
2x4 (dp, tp) mesh it builds at least ``--min-plans`` distinct plans: autoplan's own plan
(as ``autoplan suggest --profile cpu-gloo`` makes it), every baseline that applies
(``autoplan/evaluate/baselines.py``) and seeded random plans (random placements pinned on a random
share of the parameters and, half the time, on the batch; autoplan solves the rest, and
plans that do not fit the memory budget or repeat an earlier layout are drawn again).
Each plan's prediction is ``autoplan.score`` under the profile; its measured time is the
median step time (forward, backward, AdamW step) on 8 gloo processes, one thread each,
all plans of all models in one launch (``autoplan/verify/measure.py``). Every plan is timed in
each of ``--passes`` passes (each pass in its own random order) and the lowest of its
medians is kept; "pass spread" says how far a plan's passes lay apart.

Per model it prints the Spearman rank correlation of predicted and measured times, the
median absolute percentage error (MdAPE) of the prediction, and the measured time of the
auto plan over the best measured baseline; the targets (issue 45) are Spearman >= 0.9,
MdAPE <= 10 % with errors of both signs (one-signed errors mean a missing term: "over"
is the share of plans predicted slower than measured), and auto <= 1.05 x best baseline.
Everything measured goes to ``OUT/fidelity.json`` and a log-log scatter plot to
``OUT/fidelity.png``.

``--pipeline`` measures pipelined plans instead (issue 47): each model (default
``pipeline_llama``, an eight-layer Llama from ``tests/models/``) planned on a 2x2x2
(pp, dp, tp) mesh, autoplan's plan (``auto``) and every other schedule, stages per rank and
microbatch count the pipeline planner priced for that layout (``schedule``: the stage
split and checkpointing it gave each; ``--min-plans`` in all, spread over the predicted
times), each predicted by ``autoplan.score`` and stepped
with ``Pipelined.step`` on 8 gloo processes; "auto / best" then compares autoplan's
pipeline with the fastest one measured.

``--compile block|whole`` plans and scores every plan priced for that regime
(``cost/regime.py``) and times each step compiled so (inductor, ``verify/compiled.py``;
the warm-up steps compile it, 20-150 s per plan on a 2-core host), writing
``OUT/fidelity-REGIME.json`` and ``.png``.

Measured times on a shared host vary with whatever else runs on it. The "other load"
column is the share of the host's CPU time other programs took while a plan was timed
(``autoplan/verify/measure.py``); a plan timed while it was above ``--max-foreign`` is timed
again after a pause, up to ``--retries`` times, keeping the least disturbed run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoplan.explain.progress import rows_on_stderr  # noqa: E402

MODELS = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama", "moe")
PIPELINE_MODELS = ("pipeline_llama",)
MESH, AXIS_NAMES, WORLD = (2, 4), ("dp", "tp"), 8
PIPELINE_MESH, PIPELINE_AXES = (2, 2, 2), ("pp", "dp", "tp")
TARGET_SPEARMAN, TARGET_MDAPE, TARGET_RATIO = 0.9, 0.10, 1.05


@dataclass
class Candidate:
    model: str
    label: str
    kind: str
    """"auto", "baseline" or "random"."""
    plan_json: str
    predicted_s: float
    compute_s: float
    comm_s: float
    measured_s: float = math.nan
    steps_s: tuple = ()
    error: str = ""
    foreign_share: float = math.nan
    """Share of host CPU other programs took while the plan was timed."""
    attempts: int = 0
    ops: int = 0
    """Ops one measured step dispatched (forward, backward, optimizer; DTensor ops count once)."""
    passes: list = field(default_factory=list)
    """StepTimes of each pass."""
    pass_medians_s: tuple = ()

    def take_best_pass(self) -> None:
        """The measured time is the lowest of the passes' medians (best of N, as timeit does):
        another program's load only ever adds time."""
        ok = [r for r in self.passes if r.ok and math.isfinite(r.median_s)]
        self.pass_medians_s = tuple(r.median_s for r in self.passes)
        if not ok:
            self.error = next((r.error for r in self.passes if r.error), "not measured")
            return
        best = min(ok, key=lambda r: r.median_s)
        self.measured_s, self.steps_s, self.foreign_share, self.attempts, self.ops = (
            best.median_s, best.steps_s, best.foreign_share, best.attempts, best.ops)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated example names (default: every zoo model; with --pipeline "
                        f"{','.join(PIPELINE_MODELS)})")
    parser.add_argument("--pipeline", action="store_true",
                        help="measure pipelined plans on a 2x2x2 (pp, dp, tp) mesh: autoplan's and every other schedule priced")
    parser.add_argument("--profile", default="cpu-gloo")
    parser.add_argument("--random", type=int, default=6, help="random plans per model (at least)")
    parser.add_argument("--min-plans", type=int, default=10, help="more random plans until each model has this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=7, help="timed steps per plan (at most)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=5.0, help="timed steps stop after about this long")
    parser.add_argument("--max-foreign", type=float, default=0.1,
                        help="redo a plan's timing when other programs took more than this share of the host's CPU")
    parser.add_argument("--retries", type=int, default=2, help="redos per plan (the least disturbed run is kept)")
    parser.add_argument("--passes", type=int, default=2, help="times every plan is timed, in separate passes (best kept)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--predict-only", action="store_true", help="build and score the plans, measure nothing")
    parser.add_argument("--compile", choices=("none", "block", "whole"), default="none",
                        help="the regime plans are priced for and steps run in (default none: eager)")
    args = parser.parse_args(argv)

    from autoplan.verify.measure import OP_OVERHEAD_PROBE, MeasureConfig, MeasureJob, measure_step_times

    started = time.perf_counter()
    candidates: list[Candidate] = []
    skipped: dict[str, str] = {}
    models = (args.models or ",".join(PIPELINE_MODELS if args.pipeline else MODELS)).split(",")
    mesh = PIPELINE_MESH if args.pipeline else MESH
    with rows_on_stderr(len(models), "models planned and scored") as progress:
        for name in models:
            progress.started(name)
            try:
                found, notes = plans_for_model(name, args)
            except Exception as err:  # a model that does not plan is reported, the rest go on
                skipped[name] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                print(f"{name}: not planned: {skipped[name]}", flush=True)
                continue
            finally:
                progress.finished(name)
            candidates.extend(found)
            print(f"{name}: {len(found)} plans ({', '.join(c.label for c in found)})", flush=True)
            for note in notes:
                print(f"  {note}", flush=True)
    plan_s = time.perf_counter() - started

    load_before = os.getloadavg()
    measure_s, op_overhead_s = 0.0, math.nan
    if not args.predict_only and candidates:
        # Every pass times every plan, each pass in its own seeded random order, so that a change
        # in the host's load during the launch does not line up with one model or kind of plan.
        rng = random.Random(args.seed)
        order = []
        for _ in range(args.passes):
            one_pass = list(range(len(candidates)))
            rng.shuffle(one_pass)
            order += one_pass
        jobs = [MeasureJob(OP_OVERHEAD_PROBE, "", "", "probe")]
        jobs += [MeasureJob(str(model_path(candidates[i].model)), "build_model", candidates[i].plan_json,
                            f"{candidates[i].model}/{candidates[i].label}", args.compile) for i in order]
        config = MeasureConfig(warmup=args.warmup, steps=args.steps, budget_s=args.budget_s, seed=args.seed,
                               max_foreign_share=args.max_foreign, retries=args.retries)
        print(f"measuring {len(candidates)} plans x {args.passes} passes on {WORLD} gloo processes (mesh "
            f"{'x'.join(map(str, mesh))}, compile {args.compile}) ...", flush=True)
        started = time.perf_counter()
        measured = Path(args.out) / "fidelity.progress.jsonl"  # one line per plan measured, to follow a long run
        measured.parent.mkdir(parents=True, exist_ok=True)
        measured.unlink(missing_ok=True)
        with rows_on_stderr(len(jobs), "plans timed") as progress, following(measured, [j.label for j in jobs], progress):
            probe, *results = measure_step_times(jobs, WORLD, config, progress=str(measured))
        op_overhead_s = probe.median_s
        for i, result in zip(order, results):
            candidates[i].passes.append(result)
        for candidate in candidates:
            candidate.take_best_pass()
        measure_s = time.perf_counter() - started
    load_after = os.getloadavg()

    summaries = report(candidates, skipped, args.predict_only, op_overhead_s)
    if math.isfinite(op_overhead_s):
        from autoplan.cost.profile import load_profile

        used = load_profile(args.profile)
        print(f"time per dispatched op of tiny replicated DTensor ops, forward and backward, on every rank at once: "
              f"{op_overhead_s * 1e6:.0f} us (the profile's kernel_overhead_s: {used.kernel_overhead_s * 1e6:.1f} us; "
              f"dispatch: {used.dispatch.forward_op_s * 1e6:.0f} us per forward op, {used.dispatch.backward_op_s * 1e6:.0f} us "
              f"of backward per forward op, AdamW {used.dispatch.optimizer_param_s * 1e6:.0f} us per parameter)")
    print(f"planning and scoring {plan_s:.0f} s, measuring {measure_s:.0f} s (one launch); "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min), host has {os.cpu_count()} CPUs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = ("fidelity" if args.compile == "none" else f"fidelity-{args.compile}") + ("-pipeline" if args.pipeline else "")
    record = {
        "profile": args.profile, "compile": args.compile, "mesh": list(mesh), "world": WORLD, "seed": args.seed,
        "steps": args.steps, "warmup": args.warmup, "budget_s": args.budget_s,
        "load_average_before": load_before, "load_average_after": load_after,
        "skipped_models": skipped, "summary": summaries, "dtensor_op_overhead_s": op_overhead_s,
        "passes": args.passes,
        "plans": [{k: v for k, v in vars(c).items() if k not in ("plan_json", "passes")} | {"plan": json.loads(c.plan_json)}
                  for c in candidates],
    }
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1, default=list) + "\n")
    if not args.predict_only:
        from scatter_png import scatter_loglog

        shapes = {"auto": "circle", "baseline": "triangle", "random": "diamond", "schedule": "square"}
        series: dict[str, list] = {}
        for c in candidates:
            if c.error or not math.isfinite(c.measured_s):
                continue
            series.setdefault(c.model, []).append((c.predicted_s * 1e3, c.measured_s * 1e3, shapes[c.kind]))
        if series:
            png = scatter_loglog(series, f"step time, {args.profile} profile, {WORLD} gloo ranks {'x'.join(map(str, mesh))}, "
                                 f"compile {args.compile}", "predicted ms", "measured ms")
            (out / f"{stem}.png").write_bytes(png)
            print(f"wrote {out / f'{stem}.json'} and {out / f'{stem}.png'}")
    return 0


@contextmanager
def following(lines: Path, labels: list[str], progress):
    """Feed ``progress`` from the file rank 0 appends a line to per job timed (the launch
    runs in other processes): the jobs, ``labels`` in order, done and the one being timed."""
    if not progress.shown:
        yield
        return
    stop = threading.Event()

    def follow():
        done = 0
        progress.started(labels[0])
        while not stop.wait(1.0):
            now = min(len(lines.read_text().splitlines()) if lines.exists() else 0, len(labels))
            for i in range(done, now):
                progress.finished(labels[i])
                if i + 1 < len(labels):
                    progress.started(labels[i + 1])
            done = now

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def model_path(name: str) -> Path:
    """``examples/NAME.py``, else ``tests/models/NAME.py`` (the pipeline's eight-layer Llama)."""
    example = ROOT / "examples" / f"{name}.py"
    return example if example.exists() else ROOT / "tests" / "models" / f"{name}.py"


def pipelined_plans_for_model(name: str, args) -> tuple[list[Candidate], list[str]]:
    """autoplan's pipelined plan and one plan per other option the pipeline planner priced on
    its layout, each predicted by ``autoplan.score``."""
    import autoplan
    from autoplan.model_file import load_model_file
    from autoplan.pipeline_parallel.planner import plan_for_option, suggest_pipelined

    loaded = load_model_file(str(model_path(name)))
    model, batch = loaded.model, loaded.example_inputs
    plan, report = suggest_pipelined(model, batch, PIPELINE_MESH, PIPELINE_AXES, args.profile, loss_fn=loaded.loss_fn,
                                     compile=args.compile)
    blocks = report.chosen.problem.blocks
    chosen = report.chosen.best
    found, notes, seen = [], [], set()
    options = []
    for option in sorted(report.chosen.options, key=lambda o: o.step_s):
        key = (option.schedule, option.microbatches, tuple(s.blocks for s in option.stages))
        if key not in seen and option is not chosen:
            seen.add(key)
            options.append(option)
    # at most --min-plans in all: the others spread evenly over the predicted times
    keep = max(1, args.min_plans - 1)
    if len(options) > keep:
        step = (len(options) - 1) / max(1, keep - 1)
        options = [options[round(i * step)] for i in range(keep)]
        notes.append(f"{keep} of the {len(seen)} other options priced, spread over their predicted times")
    for option in [chosen, *options]:
        if not option.fits:
            notes.append(f"{_option_label(option)}: does not fit the memory budget, measured anyway")
        one = plan if option is chosen else plan_for_option(model, blocks, report.chosen, option)
        scored = autoplan.score(model, batch, one, loss_fn=loaded.loss_fn)
        found.append(Candidate(name, _option_label(option), "auto" if option is chosen else "schedule", one.to_json(),
                               scored.step_time_s, scored.compute_s, scored.comm_s))
    return found, notes


def _option_label(option) -> str:
    virtual = f"x{option.schedule.virtual}" if option.schedule.virtual > 1 else ""
    return f"{option.schedule.name}{virtual}/{option.microbatches}mb"


def plans_for_model(name: str, args) -> tuple[list[Candidate], list[str]]:
    if args.pipeline:
        return pipelined_plans_for_model(name, args)
    from autoplan.errors import NotApplicableError
    from autoplan.evaluate.baselines import BASELINES, baseline_for_problem
    from autoplan.evaluate.score import score_problem
    from autoplan.model_file import load_model_file
    from autoplan.pipeline.pinning import Pins
    from autoplan.pipeline.problem import prepare_problem, solve_problem

    loaded = load_model_file(str(ROOT / "examples" / f"{name}.py"))
    problem = prepare_problem(loaded.model, loaded.example_inputs, MESH, AXIS_NAMES, args.profile, regime=args.compile)
    notes: list[str] = []
    plans: list[tuple[str, str, object]] = [("auto", "auto", solve_problem(problem, Pins(problem), over_budget=True)[0])]
    for baseline in BASELINES:
        try:
            built = baseline_for_problem(baseline, problem)
        except NotApplicableError as err:
            notes.append(f"{baseline}: not applicable ({err.problem})")
            continue
        if not built.fits:
            notes.append(f"{baseline}: does not fit the memory budget, measured anyway")
        plans.append((baseline, "baseline", built.plan))
    taken = {_layout_key(plan) for _, _, plan in plans}
    count = max(args.random, args.min_plans - len(plans))
    for label, plan in random_plans(problem, count, args.seed, taken):
        plans.append((label, "random", plan))
    found = []
    for label, kind, plan in plans:
        scored = score_problem(problem, plan)
        found.append(Candidate(name, label, kind, plan.to_json(), scored.step_time_s, scored.compute_s, scored.comm_s))
    return found, notes


def random_plans(problem, count: int, seed: int, taken: set) -> list[tuple[str, object]]:
    """``count`` distinct random layouts that fit, each solved by autoplan; seeded."""
    from autoplan.pipeline.pinning import Pins
    from autoplan.pipeline.problem import solve_problem

    rng = random.Random(f"{seed}")
    choices = problem.choices
    parameters = [(node, fqns[0]) for node, fqns in problem.traced.parameters.items()]
    parameter_nodes = set(problem.traced.parameters)
    batch = list(problem.traced.inputs.items())
    found = []
    for _ in range(20 * count):
        if len(found) == count:
            break
        pins = Pins(problem)
        share = rng.choice((0.25, 0.5, 1.0))  # of the parameters pinned; the solver places the rest
        with_batch = rng.random() < 0.5
        for node, what in parameters + (batch if with_batch else []):
            if node in parameter_nodes and rng.random() >= share:
                continue
            specs = sorted({s.outputs[0] for s in choices.strategies(node)})
            pins.value(node, 0, rng.choice(specs), what, strict=True)
        plan, _, fits = solve_problem(problem, pins, over_budget=True)
        key = _layout_key(plan)
        if fits and key not in taken:
            taken.add(key)
            found.append((f"random{len(found)}", plan))
    return found


def _layout_key(plan) -> str:
    return json.dumps([sorted(plan.parameters.items()), sorted((k, b.placements) for k, b in plan.inputs.items())])


def _pass_spread(group: list[Candidate]) -> float:
    """Median over plans of (slowest pass - fastest pass) / fastest: how much a timing moves between passes."""
    spreads = []
    for c in group:
        medians = [m for m in c.pass_medians_s if math.isfinite(m)]
        if len(medians) > 1:
            spreads.append((max(medians) - min(medians)) / min(medians))
    return statistics.median(spreads) if spreads else math.nan


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation, ties given their average rank."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def report(candidates: list[Candidate], skipped: dict[str, str], predict_only: bool, op_overhead_s: float = math.nan) -> dict:
    summaries = {}
    by_model: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_model.setdefault(c.model, []).append(c)
    for model, group in by_model.items():
        print(f"\n== {model}")
        print(f"  {'plan':<28} {'predicted ms':>12} {'compute':>9} {'comm':>9} {'measured ms':>12} {'error':>8} {'other load':>10}")
        for c in group:
            error = (c.predicted_s - c.measured_s) / c.measured_s if math.isfinite(c.measured_s) else math.nan
            line = (f"  {c.label:<28} {c.predicted_s * 1e3:>12.2f} {c.compute_s * 1e3:>9.2f} {c.comm_s * 1e3:>9.2f} "
                    f"{c.measured_s * 1e3:>12.2f} {error:>+8.1%} {c.foreign_share:>10.1%}")
            print(line + (f"  FAILED: {c.error}" if c.error else ""))
        if predict_only:
            continue
        ok = [c for c in group if not c.error and math.isfinite(c.measured_s)]
        rho = spearman([c.predicted_s for c in ok], [c.measured_s for c in ok]) if len(ok) > 2 else math.nan
        mdape = statistics.median(abs(c.predicted_s - c.measured_s) / c.measured_s for c in ok) if ok else math.nan
        over = sum(c.predicted_s > c.measured_s for c in ok) / len(ok) if ok else math.nan
        auto = next((c for c in ok if c.kind == "auto"), None)
        baselines = [c for c in ok if c.kind in ("baseline", "schedule")]  # pipelined: the other schedules
        best = min(baselines, key=lambda c: c.measured_s) if baselines else None
        ratio = auto.measured_s / best.measured_s if auto and best else math.nan
        # Diagnostic, not autoplan's prediction: every op the step dispatched also pays the
        # probe's per-op time (DTensor and autograd bookkeeping of a tiny op, all ranks busy).
        with_overhead = statistics.median(
            abs(c.predicted_s + c.ops * op_overhead_s - c.measured_s) / c.measured_s for c in ok
        ) if ok else math.nan
        summaries[model] = {
            "plans": len(group), "measured": len(ok), "spearman": rho, "mdape": mdape, "over_share": over,
            "median_ops": statistics.median(c.ops for c in ok) if ok else 0, "mdape_with_op_overhead": with_overhead,
            "pass_spread": _pass_spread(ok),
            "median_other_load": statistics.median(c.foreign_share for c in ok) if ok else math.nan,
            "auto_measured_s": auto.measured_s if auto else math.nan,
            "best_baseline": best.label if best else None,
            "best_baseline_measured_s": best.measured_s if best else math.nan,
            "auto_over_best_baseline": ratio,
        }
        verdict = lambda ok_: "met" if ok_ else "MISSED"  # noqa: E731
        print(f"  Spearman {rho:.3f} ({verdict(rho >= TARGET_SPEARMAN)}), MdAPE {mdape:.1%} ({verdict(mdape <= TARGET_MDAPE)}), "
              f"over-predicted {over:.0%} ({verdict(0 < over < 1)}: errors of both signs), "
              f"auto {auto.measured_s * 1e3 if auto else math.nan:.1f} ms / best baseline "
              f"{best.label if best else '-'} {best.measured_s * 1e3 if best else math.nan:.1f} ms = {ratio:.3f} "
              f"({verdict(ratio <= TARGET_RATIO)}); {len(ok)} of {len(group)} plans measured")
    if summaries:
        print(f"\n{'model':<12} {'plans':>5} {'Spearman':>9} {'MdAPE':>7} {'over':>5} "
              f"{'auto/best':>10} {'other load':>10} {'pass spread':>11}   "
              f"{'ops/step':>8} {'MdAPE with ops x probe (diagnostic)':>10}")
        for model, s in summaries.items():
            print(f"{model:<12} {s['measured']:>5} {s['spearman']:>9.3f} {s['mdape']:>7.1%} {s['over_share']:>5.0%} "
                  f"{s['auto_over_best_baseline']:>10.3f} "
                  f"{s['median_other_load']:>10.1%} {s['pass_spread']:>11.1%}   {s['median_ops']:>8.0f} "
                      f"{s['mdape_with_op_overhead']:>10.1%}")
    for model, why in skipped.items():
        print(f"{model:<12} not planned: {why}")
    return summaries


if __name__ == "__main__":
    raise SystemExit(main())
