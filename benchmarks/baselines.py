"""autoplan's plan beside the layouts people write by hand, priced by the same cost model.

    python benchmarks/baselines.py MODEL.py[:BUILDER] [--mesh 2x4] [--profile h100-sxm]
                                   [--memory-gb N] [--out DIR] [--recompute recipe|full|selective|none]
                                   [--compile none|block|whole]

Traces the model once, solves autoplan's own plan and every baseline that applies
(``autoplan/evaluate/baselines.py``: data parallel, FSDP, Megatron, Megatron + FSDP,
torchtitan's recipe) on that problem, and prints each one's predicted step time (compute,
communication), peak memory per device and whether it fits the budget, with the ratio to
autoplan's plan. Every time printed is what ``autoplan score`` gives for that plan file
(a baseline is solved as ``score`` solves any layout). ``--out DIR`` writes each plan as
``DIR/NAME.json`` (atomically), to score, show or apply.

Recompute: autoplan's plan checkpoints what the solver decides (as ``suggest`` does); each
baseline is scored with the checkpointing its recipe runs every repeated block with
(``--recompute recipe``, the default: ``RECIPE_RECOMPUTE``, torchtitan "full"), or with
the mode given to all ("none": none, as before; at a training batch most baselines then
do not fit). ``--compile`` prices every plan in that regime (``cost/regime.py``).

    python benchmarks/baselines.py examples/llama3.py:make_8b_2layers --mesh 8x8
    python benchmarks/baselines.py benchmarks/models/llama3_8b_4k.py --mesh 8x8 --compile block
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from autoplan.cost.regime import DEFAULT_REGIME, REGIMES
from autoplan.errors import NotApplicableError
from autoplan.evaluate.baselines import BASELINES, RECIPE_RECOMPUTE, baseline_for_problem
from autoplan.explain.progress import rows_on_stderr
from autoplan.model_file import load_model_file
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import prepare_problem, solve_problem

GIB = 2**30


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="MODEL.py[:BUILDER]")
    parser.add_argument("--mesh", default="2x4")
    parser.add_argument("--axis-names", default=None, help="default dp,tp (2-D) or the last ones of cp,dp,tp")
    parser.add_argument("--profile", default="h100-sxm")
    parser.add_argument("--memory-gb", type=float, default=None, help="per-device budget in GB (10^9 bytes)")
    parser.add_argument("--out", type=Path, default=None, help="write each plan as OUT/NAME.json")
    parser.add_argument("--recompute", choices=("recipe", "full", "selective", "none"), default="recipe",
                        help="the baselines' checkpointing: each recipe's own (default), one mode for all, or none")
    parser.add_argument("--compile", choices=REGIMES, default=DEFAULT_REGIME, help="the regime every plan is priced in")
    args = parser.parse_args(argv)

    mesh = tuple(int(n) for n in args.mesh.split("x"))
    names = tuple(args.axis_names.split(",")) if args.axis_names else ("cp", "dp", "tp")[-len(mesh):]
    loaded = load_model_file(args.model)
    start = time.perf_counter()
    with rows_on_stderr(2 + len(BASELINES), "solves") as progress:
        progress.started("tracing and costing")
        problem = prepare_problem(loaded.model, loaded.example_inputs, mesh, names, args.profile, args.memory_gb,
                                  loss_fn=loaded.loss_fn, regime=args.compile)
        progress.finished("tracing and costing")
        progress.started("autoplan")
        # as ``suggest`` solves it: the solver decides the checkpointing with the layout
        auto, _, fits = solve_problem(problem, Pins(problem), over_budget=True, recompute=True)
        progress.finished("autoplan")
        rows = [("autoplan", auto, fits, ())]
        for name in BASELINES:
            progress.started(name)
            mode = {"recipe": RECIPE_RECOMPUTE[name], "none": None}.get(args.recompute, args.recompute)
            try:
                baseline = baseline_for_problem(name, problem, recompute=mode)
            except NotApplicableError as err:
                rows.append((name, None, False, (str(err),)))
                continue
            finally:
                progress.finished(name)
            rows.append((name, baseline.plan, baseline.fits, baseline.notes))
    print(f"{args.model} on {args.mesh} ({','.join(names)}), profile {args.profile}, compile {args.compile}, "
          f"baselines' recompute: {args.recompute}; budget {problem.budget_words()}; {time.perf_counter() - start:.1f} s")
    print(f"{'plan':<15} {'step ms':>9} {'compute':>9} {'comm':>9} {'peak GiB':>9} {'fits':>5} {'x auto':>7}  "
          f"{'recompute':<16} notes")
    for name, plan, fits, notes in rows:
        if plan is None:
            print(f"{name:<15} {'-':>9} {'':>9} {'':>9} {'':>9} {'':>5} {'':>7}  {'':<16} not applicable: {notes[0]}")
            continue
        p = plan.predicted
        ratio = p.step_time_s / auto.predicted.step_time_s
        print(
            f"{name:<15} {p.step_time_s * 1e3:9.2f} {p.compute_s * 1e3:9.2f} {p.comm_s * 1e3:9.2f} "
            f"{p.peak_memory_bytes / GIB:9.2f} {'yes' if fits else 'no':>5} {ratio:7.2f}  {_recompute_words(plan):<16} "
            f"{'; '.join(notes)}"
        )
        if args.out is not None:
            plan.save(args.out / f"{name}.json")
    return 0


def _recompute_words(plan) -> str:
    """The plan's checkpointing: "full x32" (mode and how many modules), "none"."""
    modes = sorted(set(plan.recompute.values()))
    if not modes:
        return "none"
    return ", ".join(f"{mode} x{sum(1 for m in plan.recompute.values() if m == mode)}" for mode in modes)


if __name__ == "__main__":
    sys.exit(main())
