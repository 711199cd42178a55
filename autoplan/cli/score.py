"""``autoplan score``: predicted step time, breakdown and peak memory of any plan file."""

from __future__ import annotations

import argparse

from autoplan.cli.suggest import _positive_float, add_memory_flags
from autoplan.model_file import load_model_file, parse_mesh


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "score",
        help="predict the step time and memory of a plan",
        description="Trace MODEL, pin the plan's parameter, batch and module boundary layouts, "
        "and print the predicted step time (compute, communication) and peak memory per device "
        "of the cheapest execution of that layout.",
    )
    parser.add_argument(
        "model", metavar="MODEL.py[:BUILDER]", help="model file (builder defaults to build_model)"
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan file (from `autoplan suggest` or hand-written)")
    parser.add_argument("--profile", help="cluster profile: a built-in NAME or a JSON FILE (default: the plan's)")
    parser.add_argument("--mesh", help="expected mesh shape, e.g. 2x4 (default: the plan's)")
    add_memory_flags(parser, "the budget the plan was made under, else the profile's device memory")
    parser.add_argument("--time-limit", type=_positive_float, help="solver time limit in seconds")
    parser.add_argument("--microbatches", type=_positive_int, metavar="K",
                        help="price a plan without stages as K steps of gradient accumulation (the batch cut into K "
                        "microbatches along dim 0), as the pipeline planner prices one stage; a plan with stages "
                        "is always priced with its own schedule and microbatches")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    mesh = parse_mesh(args.mesh) if args.mesh else None
    from autoplan.plan.module_plan import Plan  # torch, imported when the command runs

    plan = Plan.load(args.plan)
    loaded = load_model_file(args.model)
    # Imported here so that flag and file errors are reported without loading the solver.
    from autoplan.evaluate.score import score
    from autoplan.explain.progress import progress_on_stderr

    with progress_on_stderr() as progress:  # None unless stderr is a terminal (or AUTOPLAN_PROGRESS=plain)
        result = score(
            loaded.model, loaded.example_inputs, plan, args.profile, args.memory_gb, args.time_limit, mesh,
            loaded.loss_fn, progress, memory_gib=args.memory_gib, microbatches=args.microbatches,
        )
    print(f"plan {args.plan} for {loaded.name}")
    print(result.summary())
    if result.plan.pipeline is not None:  # the stages as priced
        from autoplan.explain.render import render
        from autoplan.explain.stages import pipeline_sections

        render(pipeline_sections(result.plan)[:1])
    elif args.microbatches is not None:
        print(f"gradient accumulation: {args.microbatches} microbatches per step, one optimizer step; "
              "priced as the pipeline planner prices one stage (docs/pipeline.md)")
    own = plan.predicted.step_time_s
    print(f"the plan file's own prediction: {own * 1e3:.3f} ms (profile {plan.profile})")
    return 0
