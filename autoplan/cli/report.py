"""``autoplan report``: one self-contained HTML file with the show and explain tables and figures."""

from __future__ import annotations

import argparse

from autoplan._files import check_outputs, write_outputs
from autoplan.cli.suggest import _positive_float, add_memory_flags
from autoplan.model_file import load_model_file


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="write an HTML report of a plan (tables and figures, self-contained)",
        description="Explain PLAN for MODEL (as `autoplan explain`) and write one HTML file that opens without "
        "network: the show and explain tables, time per block, memory against the budget, communication "
        "volume per axis and, with --fidelity, predicted against measured step times.",
    )
    parser.add_argument("model", metavar="MODEL.py[:BUILDER]", help="model file the plan was made for")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file")
    parser.add_argument("--out", required=True, help="HTML file to write (atomically)")
    parser.add_argument("--fidelity", metavar="FILE", help="benchmarks/fidelity.py's fidelity.json, for the scatter")
    parser.add_argument("--profile", help="cluster profile: a built-in NAME or a JSON FILE (default: the plan's)")
    add_memory_flags(parser, "the budget the plan was made under, else the profile's device memory")
    parser.add_argument("--time-limit", type=_positive_float, help="solver time limit per solve, seconds")
    return parser


def run(args: argparse.Namespace) -> int:
    from autoplan.plan.module_plan import Plan

    plan = Plan.load(args.plan)
    loaded = load_model_file(args.model)
    check_outputs({"--out": args.out}, {"the model file": loaded.path, "the plan file": args.plan, "the --fidelity file": args.fidelity})
    from autoplan.evaluate.score import plan_profile
    from autoplan.explain.explain import explain_plan
    from autoplan.explain.progress import progress_on_stderr
    from autoplan.explain.report import read_fidelity, render_report
    from autoplan.explain.show import summarize

    fidelity = read_fidelity(args.fidelity) if args.fidelity else None
    profile = plan_profile(plan, args.profile)
    with progress_on_stderr() as progress:
        explanation = explain_plan(
            loaded.model, loaded.example_inputs, plan, None, profile, args.memory_gb, args.time_limit, loaded.loss_fn, progress,
            command="report", memory_gib=args.memory_gib,
        )
        if progress:
            progress("drawing the figures")
        text = render_report(f"autoplan: {loaded.name} on {'x'.join(map(str, plan.mesh_shape))} ({args.plan})",
                             plan, summarize(plan, profile), explanation, profile, fidelity)
    write_outputs({args.out: text}, {"--out": args.out})
    print(f"report written to {args.out}")
    return 0
