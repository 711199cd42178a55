"""``autoplan suggest``: plan a model file for a mesh and write the plan as JSON."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from autoplan._files import check_outputs, plan_default_path, write_outputs
from autoplan.cost.regime import DEFAULT_REGIME, REGIMES
from autoplan.errors import OptionError
from autoplan.model_file import load_model_file, parse_axis_names, parse_mesh


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "suggest",
        help="suggest a parallelization plan",
        description="Trace MODEL on the meta device, solve for the cheapest sharding on the "
        "mesh and write the plan as JSON.",
    )
    parser.add_argument(
        "model", metavar="MODEL.py[:BUILDER]", help="model file (builder defaults to build_model)"
    )
    parser.add_argument("--mesh", help="mesh shape, sizes joined by x, e.g. 2x4 (or --devices)")
    parser.add_argument("--axis-names", help="comma-separated mesh axis names, e.g. dp,tp; an axis named pp is a "
                        "pipeline axis: stages, schedule and microbatches are planned with the layout (docs/pipeline.md)")
    parser.add_argument("--devices", type=_positive_int, metavar="N",
                        help="instead of --mesh: N devices, the mesh shape (pp x dp x tp) chosen too (docs/pipeline.md)")
    parser.add_argument("--devices-per-node", type=_positive_int, metavar="N",
                        help="with --devices: devices per node (default: the profile's); tensor parallelism stays in a node")
    parser.add_argument("--profile", help="cluster profile: a built-in NAME or a JSON FILE")
    add_memory_flags(parser, "the profile's device memory")
    parser.add_argument("--time-limit", type=_positive_float, help="solver time limit in seconds")
    parser.add_argument("--out", help="plan file to write (default: plans_out/MODEL-MESH.json)")
    parser.add_argument(
        "--no-cache", action="store_true",
        help="always solve: neither read nor write the plan cache (plans_out/cache/)",
    )
    parser.add_argument("--stats", help="also write the run's numbers (stage times, sizes, solver) to this JSON file")
    parser.add_argument("--no-tie", action="store_true", help="plan every layer separately (default: identical layers alike)")
    parser.add_argument("--no-recompute", action="store_true",
                        help="never checkpoint the repeated layers (default: the solver decides, with the layout)")
    parser.add_argument(
        "--compile", choices=REGIMES, default=DEFAULT_REGIME,
        help=f"the regime the step runs in, priced as such: none (eager DTensor), block (each repeated block under "
        f"torch.compile, as torchtitan compiles) or whole (default {DEFAULT_REGIME}; docs/compile.md)",
    )
    parser.add_argument(
        "--context-axis", metavar="NAME",
        help="context parallel: also plan with the batch's sequence split over this mesh axis (attention's keys and "
        "values gathered over it) and keep the cheaper plan; the batch comes from "
        "autoplan.sequence_batch.causal_lm_batch (docs/context-parallel.md)",
    )
    parser.add_argument(
        "--expert-parallel", action="store_true",
        help="also plan with the layout of each mixture-of-experts layer's experts a decision of the solver: split "
        "over a mesh axis that divides them (tokens moved by all_to_all, the router's load taken as even; their "
        "storage may be split further on the other axes) or whole; keep the cheaper of that plan and the plan "
        "without it (docs/expert-parallel.md)",
    )
    parser.add_argument(
        "--verbose", action="store_true",
        help="also list every parameter's placements (default: the layout per module in words, layers folded)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    if (args.mesh is None) == (args.devices is None):
        raise OptionError("give --mesh (a mesh shape, e.g. 8x8) or --devices (a device count, the shape chosen too), "
                         "one of them")
    if args.devices_per_node is not None and args.devices is None:
        raise OptionError("--devices-per-node goes with --devices; with --mesh the profile says how many devices a node has")
    if args.devices is not None:
        from autoplan.cli.suggest_pipeline import run_pipelined

        return run_pipelined(args, None, None)
    mesh = parse_mesh(args.mesh)
    axis_names = parse_axis_names(args.axis_names, mesh)
    if "pp" in axis_names:
        from autoplan.cli.suggest_pipeline import run_pipelined

        return run_pipelined(args, mesh, axis_names)
    loaded = load_model_file(args.model)
    out = args.out or plan_default_path(loaded.name, mesh)
    outputs = {"--out": out, **({"--stats": args.stats} if args.stats else {})}
    check_outputs(outputs, {"the model file": loaded.path, "the --profile file": _profile_file(args.profile)})
    # Imported here so that flag and model-file errors are reported without loading the solver.
    from autoplan.explain.progress import progress_on_stderr
    from autoplan.pipeline.cached import suggest_cached
    from autoplan.pipeline.suggest import suggest_with_report

    if args.context_axis is not None:
        if args.expert_parallel:  # each is priced against the plan solved without it; not both at once yet
            raise OptionError("--context-axis and --expert-parallel are not planned together yet: plan with one of them")
        return _run_context_parallel(args, loaded, mesh, axis_names, out, outputs)
    plan_fn = suggest_with_report if args.no_cache else suggest_cached
    # only the flags given are passed: the planners' defaults hold otherwise
    flags: dict[str, Any] = {
        **({"memory_gib": args.memory_gib} if args.memory_gib is not None else {}),
        **({"tie": False} if args.no_tie else {}),
        **({"recompute": False} if args.no_recompute else {}),
        **({"compile": args.compile} if args.compile != DEFAULT_REGIME else {}),
        **({"expert_parallel": True} if args.expert_parallel else {}),
    }
    with progress_on_stderr() as progress:  # None unless stderr is a terminal
        plan, report = plan_fn(
            loaded.model,
            loaded.example_inputs,
            mesh,
            axis_names,
            args.profile,
            args.memory_gb,
            args.time_limit,
            **flags,
            loss_fn=loaded.loss_fn,
            **({"progress": progress} if progress else {}),
        )
    texts = {out: plan.to_json()}
    if args.stats:
        stats = {**report.stats(), "peak_rss_bytes": _peak_rss_bytes()}
        texts[args.stats] = json.dumps(stats, indent=2, sort_keys=True) + "\n"
    write_outputs(texts, outputs)
    report.render(sys.stdout, verbose=args.verbose)
    cache = report.extra.get("cache")
    if cache == "hit":
        print(f"plan reused from the plan cache {report.extra['cache_path']} (no solve; --no-cache solves again)")
    elif cache in ("miss", "replaced"):
        print(f"plan stored in the plan cache {report.extra['cache_path']}")
    print(f"plan written to {out}")
    return 0


def _run_context_parallel(args, loaded, mesh, axis_names, out, outputs: dict) -> int:
    """``suggest --context-axis``: solved with and without the sequence split (no plan cache)."""
    from autoplan.explain.progress import progress_on_stderr
    from autoplan.explain.render import render
    from autoplan.explain.show import show_sections, summarize
    from autoplan.pipeline.context_parallel import suggest_context_parallel

    if args.memory_gb is not None:
        raise OptionError("--context-axis takes the budget as --memory-gib")
    with progress_on_stderr() as progress:
        choice = suggest_context_parallel(
            loaded.model, loaded.example_inputs, mesh, axis_names, args.context_axis, profile=args.profile,
            memory_gib=args.memory_gib, time_limit_s=args.time_limit, recompute=not args.no_recompute,
            loss_fn=loaded.loss_fn, progress=progress,
        )
    texts = {out: choice.plan.to_json()}
    if args.stats:
        stats = {"context_step_s": choice.context_step_s, "plain_step_s": choice.plain_step_s,
                 "context_fits": choice.context_fits, "plain_fits": choice.plain_fits,
                 "kept": "context" if choice.plan.context_parallel is not None else "plain",
                 "peak_rss_bytes": _peak_rss_bytes()}
        texts[args.stats] = json.dumps(stats, indent=2, sort_keys=True) + "\n"
    write_outputs(texts, outputs)
    render(show_sections(summarize(choice.plan), str(out)), sys.stdout)
    print(f"plan written to {out}")
    return 0


def _profile_file(profile: str | None):
    """The file --profile names (an input no output may overwrite), if it exists."""
    from autoplan.cost.profile import profile_path

    path = profile_path(profile)
    return path if path.is_file() else None


def _peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def add_memory_flags(parser: argparse.ArgumentParser, default: str) -> None:
    """``--memory-gb N`` (N x 10**9 bytes) or ``--memory-gib N`` (N x 2**30 bytes), not both."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--memory-gb", type=_positive_float, metavar="N",
                       help=f"memory budget per device in GB, N x 10^9 bytes (default: {default})")
    group.add_argument("--memory-gib", type=_positive_float, metavar="N",
                       help="memory budget per device in GiB, N x 2^30 bytes (what devices report)")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value
