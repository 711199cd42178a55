"""``autoplan export``: a plan as PyTorch ParallelStyles + fully_shard, or as a veScale plan."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from autoplan._files import check_outputs, write_outputs

FORMATS = ("torch", "vescale")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="export a plan to PyTorch ParallelStyles or a veScale plan",
        description="Write PLAN.json as a Python module with a parallelize_module plan on the tp axis "
        "and fully_shard on the dp axis (--format torch), or as veScale's "
        '{"parameter": ..., "forward": ...} plan (--format vescale). Parts of the plan the format '
        "cannot express are listed.",
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan file (from `autoplan suggest`)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="torch or vescale")
    parser.add_argument("--out", help="file to write (default: next to PLAN.json, PLAN_torch.py / PLAN.vescale.json)")
    parser.add_argument(
        "--model", metavar="MODEL.py[:BUILDER]",
        help="read module classes from the model (for plans written before plans recorded them)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    source = Path(args.plan)
    default = f"{source.stem.replace('-', '_')}_torch.py" if args.format == "torch" else f"{source.stem}.vescale.json"
    out = Path(args.out) if args.out else source.with_name(default)
    model_path = args.model.rpartition(":")[0] or args.model if args.model else None
    check_outputs({"--out": out}, {"the plan file": source, "the --model file": model_path})
    from autoplan.plan.module_plan import Plan  # torch, imported when the command runs

    plan = Plan.load(args.plan)
    if args.model:
        from autoplan.model_file import load_model_file

        model = load_model_file(args.model).model
        owners = {fqn.rpartition(".")[0] for fqn in plan.parameters}
        types = {fqn: type(m).__name__ for fqn, m in model.named_modules() if fqn in owners}
        plan = dataclasses.replace(plan, module_types=types)
    if args.format == "torch":
        from autoplan.interop.export_torch import export_torch

        result = export_torch(plan, source.name)
        text = result.source
        summary = f"{len(result.styles)} ParallelStyles on {result.tp_axis}" + (
            f", fully_shard on {result.dp_axis} ({len(result.fsdp_modules)} groups)" if result.dp_axis else ""
        )
        not_expressed = result.not_expressed
    else:
        from autoplan.interop.export_vescale import export_vescale

        exported = export_vescale(plan)
        text = json.dumps(exported.plan, indent=2) + "\n"
        summary = f"{len(exported.plan['parameter'])} parameters, {len(exported.plan['forward'])} forward layouts"
        not_expressed = exported.not_expressed
    write_outputs({out: text}, {"--out": out})
    print(f"exported {args.plan} as {args.format}: {summary}")
    for note in not_expressed:
        print(f"not expressed: {note}")
    print(f"written to {out}")
    return 0
