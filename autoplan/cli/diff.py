"""``autoplan diff``: two plans of one model, what differs per module and the totals side by side."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diff",
        help="compare two plans: layouts per module in words, predicted totals side by side",
        description="Compare two plans of the same model (made with another profile, budget or mesh): "
        "each module laid out differently, in words with its placements, and the predicted step time, "
        "communication per axis, memory and MFU of both.",
    )
    parser.add_argument("plan_a", metavar="A.json", help="first plan file")
    parser.add_argument("plan_b", metavar="B.json", help="second plan file")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from autoplan.explain.diff import diff_plans, diff_sections
    from autoplan.explain.render import render
    from autoplan.plan.module_plan import Plan

    a, b = Plan.load(args.plan_a), Plan.load(args.plan_b)
    result = diff_plans(a, b)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        render(diff_sections(result, args.plan_a, args.plan_b), sys.stdout)
    return 0
