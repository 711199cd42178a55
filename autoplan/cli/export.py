"""``autoplan export``: a plan as PyTorch ParallelStyles + replicate / fully_shard (scored beside
the plan when the model is given), or as a veScale plan."""

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
        "and replicate / fully_shard on the dp axis (--format torch), or as veScale's "
        '{"parameter": ..., "forward": ...} plan (--format vescale). Where the format cannot say the '
        "plan's layout it writes the nearest one it can, and lists per module what differs; with "
        "--model, the torch export's layout is scored beside the plan's (step time, peak memory).",
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan file (from `autoplan suggest`)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="torch or vescale")
    parser.add_argument("--out", help="file to write (default: next to PLAN.json, PLAN_torch.py / PLAN.vescale.json)")
    parser.add_argument(
        "--model", metavar="MODEL.py[:BUILDER]",
        help="the model the plan is for: scores the exported layout beside the plan (step time, peak memory); "
        "also reads module classes for plans written before plans recorded them",
    )
    parser.add_argument("--profile", help="cluster profile to score with: a built-in NAME or a JSON FILE (default: the plan's)")
    return parser


def run(args: argparse.Namespace) -> int:
    source = Path(args.plan)
    default = f"{source.stem.replace('-', '_')}_torch.py" if args.format == "torch" else f"{source.stem}.vescale.json"
    out = Path(args.out) if args.out else source.with_name(default)
    model_path = args.model.rpartition(":")[0] or args.model if args.model else None
    check_outputs({"--out": out}, {"the plan file": source, "the --model file": model_path})
    from autoplan.plan.module_plan import Plan  # torch, imported when the command runs

    plan = Plan.load(args.plan)
    if plan.expert_parallel:
        from autoplan.errors import PlanError

        axes = sorted({layout["axis"] for layout in plan.expert_parallel.values()})
        raise PlanError(f"the plan splits its experts over {', '.join(axes)} (expert parallel), which export does "
                        "not write yet", hint="run the plan with autoplan.apply_plan, or export a plan made without "
                        "--expert-parallel")
    loaded = None
    if args.model:
        from autoplan.model_file import load_model_file

        loaded = load_model_file(args.model)
        owners = {fqn.rpartition(".")[0] for fqn in plan.parameters}
        types = {fqn: type(m).__name__ for fqn, m in loaded.model.named_modules() if fqn in owners}
        plan = dataclasses.replace(plan, module_types=types)
    scored = None
    if args.format == "torch":
        from autoplan.interop.export_render import render_torch
        from autoplan.interop.export_torch import export_torch

        result = export_torch(plan, source.name)
        if loaded is not None:
            from autoplan.interop.export_layout import score_export

            scored, _ = score_export(loaded.model, loaded.example_inputs, plan, result, args.profile, loaded.loss_fn)
            differences = {m: tuple(v) for m, v in result.differences.items()}
            for module, lines in scored.boundaries_moved.items():  # boundary layouts the trace shows moved (data parallel splits by sample)
                differences[module] = differences.get(module, ()) + tuple(f"boundary {x}" for x in lines)
            result = dataclasses.replace(result, differences=dict(sorted(differences.items())))
            header = (scored.summary(), f"(scored with `autoplan score`'s cost model, profile {scored.plan.profile})")
            result = dataclasses.replace(result, source=render_torch(plan, result, source.name, header))
        text = result.source
        dp = result.data_parallel
        summary = f"{len(result.styles)} ParallelStyles on {result.tp_axis}" + (
            f", replicate on {result.dp_axis} ({len(dp.replicate)} modules), "
            f"fully_shard on {result.dp_axis} ({len(result.fsdp_modules)} groups)" if dp else ""
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
    if plan.pipeline is not None and args.format == "torch":
        pipeline = plan.pipeline
        starts = ", ".join(stage.modules[0] for stage in pipeline.stages)
        print(f"pipeline on {pipeline.axis}: {pipeline.size} ranks, {pipeline.schedule}, {pipeline.microbatches} microbatches, "
              f"stages start at {starts} (TORCHTITAN_PARALLELISM in the file)")
    if args.format == "torch":
        from autoplan.interop.export_table import print_export_table

        print_export_table(plan, result)
    from autoplan.interop.module_groups import group_notes

    names = set(plan.parameters) | set(plan.modules) | set(plan.module_types)
    for note in group_notes(not_expressed, names):
        print(f"not expressed: {note}")
    if plan.context_parallel is not None:
        layout = plan.context_parallel
        print(f"not expressed: the sequence split over {layout.axis} (context parallel; on CUDA, torch's "
              f"context_parallel(mesh['{layout.axis}'], buffers=..., buffer_seq_dims=[1, ...]) runs it as ring attention)")
    if scored is not None:
        print(scored.summary())
    elif args.format == "torch":
        print("not scored: pass --model MODEL.py[:BUILDER] to score the exported layout beside the plan")
    print(f"written to {out}")
    return 0
