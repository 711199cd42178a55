"""``autoplan show``: a plan file as people talk about it (layout in words, time, memory, MFU)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "show",
        help="show a plan in words: layout per module, time, memory, MFU",
        description="Read PLAN.json and print, per module (repeated blocks folded), the layout in words per "
        "mesh axis with its placements; the predicted step time split into compute and communication per "
        "mesh axis and collective; the memory per device; and the predicted MFU.",
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan file (from `autoplan suggest`)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--profile", help="cluster profile to price collectives and MFU with (default: the plan's)")
    return parser


def run(args: argparse.Namespace) -> int:
    from autoplan.explain.render import render
    from autoplan.explain.show import show_sections, summarize
    from autoplan.plan.module_plan import Plan

    plan = Plan.load(args.plan)
    profile = None
    if args.profile:
        from autoplan.cost.profile import load_profile

        profile = load_profile(args.profile)
    summary = summarize(plan, profile)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        render(show_sections(summary, args.plan), sys.stdout)
    return 0
