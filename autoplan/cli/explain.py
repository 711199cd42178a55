"""``autoplan explain``: why a plan: the alternatives per block, its largest costs, what binds."""

from __future__ import annotations

import argparse
import json
import sys

from autoplan.cli.suggest import _positive_float, add_memory_flags
from autoplan.model_file import load_model_file


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "explain",
        help="explain a plan: alternatives per block, largest costs, what binds",
        description="For each block of MODEL (a repeated layer once, and each other module with parameters), "
        "solve the layouts a person would try (replicated, FSDP, Megatron per axis, the plan's own) with that "
        "block pinned and the rest free; print their step time and memory against the plan's, the plan's ten "
        "largest communication charges, and whether memory or time binds.",
    )
    parser.add_argument("model", metavar="MODEL.py[:BUILDER]", help="model file the plan was made for")
    parser.add_argument("plan", metavar="PLAN.json", help="plan file")
    parser.add_argument("--module", metavar="FQN", help="only this module's block (a layer's number stands for every layer)")
    parser.add_argument("--profile", help="cluster profile: a built-in NAME or a JSON FILE (default: the plan's)")
    add_memory_flags(parser, "the budget the plan was made under, else the profile's device memory")
    parser.add_argument("--time-limit", type=_positive_float, help="solver time limit per solve, seconds")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from autoplan.plan.module_plan import Plan

    plan = Plan.load(args.plan)
    if plan.pipeline is not None:
        return _explain_stages(plan, args)
    loaded = load_model_file(args.model)
    from autoplan.explain.explain import explain_plan, explain_sections
    from autoplan.explain.progress import progress_on_stderr
    from autoplan.explain.render import render

    with progress_on_stderr() as progress:
        result = explain_plan(
            loaded.model, loaded.example_inputs, plan, args.module, args.profile, args.memory_gb,
            args.time_limit, loaded.loss_fn, progress, memory_gib=args.memory_gib,
        )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"plan {args.plan} for {loaded.name}")
        render(explain_sections(result), sys.stdout)
    return 0


def _explain_stages(plan, args: argparse.Namespace) -> int:
    """A pipelined plan: its stages and what other stage counts and meshes would cost."""
    from autoplan.explain.render import Section, render
    from autoplan.explain.stages import pipeline_sections

    sections = pipeline_sections(plan)
    if args.json:
        print(json.dumps(plan.pipeline.to_dict(), indent=2, sort_keys=True))
        return 0
    print(f"plan {args.plan}")
    note = ("not priced for a plan with pipeline stages: the layout is one stage's; suggest without a pp axis "
            "and explain that plan to see the blocks' alternatives")
    render([*sections, Section("per-block alternatives", notes=(note,))], sys.stdout)
    return 0
