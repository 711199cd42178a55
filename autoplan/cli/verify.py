"""``autoplan verify``: run one training step of a plan and check it against its prediction."""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager

from autoplan.cli.suggest import _positive_float
from autoplan.errors import PlanError
from autoplan.model_file import import_model_file, load_model_file, loss_function

MISMATCH_STATUS = 1
DEFAULT_TOLERANCE = 1e-5


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="run one training step of a plan and compare its collectives with the prediction",
        description="Apply PLAN to MODEL on a fake process group of the plan's world size (one process), "
        "run forward, backward and an AdamW step on fake tensors at the real shapes (no compute, no weight "
        "memory: seconds for a 1B model; real tensors where the step reads tensor values, and for --compile), "
        "and compare the collectives "
        "that ran (count and bytes per module, mesh axis and kind) with the plan's "
        "predicted.module_collectives. With --numerics, also run the step on gloo processes on "
        "127.0.0.1 and compare the loss and gradients with the single-device model. "
        "A plan with pipeline stages runs its step on gloo processes, one per device of its full mesh, each rank's "
        "collectives and point-to-point sends and receives counted against the prediction. "
        "Exits 1 on any mismatch.",
    )
    parser.add_argument(
        "model", metavar="MODEL.py[:BUILDER]", help="model file (builder defaults to build_model); use a small config"
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan file (from `autoplan suggest`)")
    parser.add_argument("--all", action="store_true", help="list every module row, not only mismatches")
    parser.add_argument(
        "--numerics", action="store_true",
        help="also compare loss and gradients on gloo processes (real compute: each process builds the whole model)",
    )
    parser.add_argument(
        "--compile", choices=("block", "whole"), default=None,
        help="run the step under torch.compile: each repeated block (nn.ModuleList items) compiled in place, or the "
        "whole model; the collectives are checked as without it, and the loss against the eager step's (both steps "
        "with the model's randomness off: dropout and stochastic depth, as --numerics runs them)",
    )
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend for --compile (default inductor; aot_eager compiles faster)"
    )
    parser.add_argument(
        "--tolerance", type=_positive_float, default=DEFAULT_TOLERANCE,
        help=f"largest relative error of loss and gradients for --numerics, and of the loss for --compile (default {DEFAULT_TOLERANCE:g})",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from autoplan.explain.progress import progress_on_stderr

    with progress_on_stderr() as progress:
        say = progress or (lambda text: None)
        say("loading torch, the plan and the model file")
        from autoplan.plan.module_plan import Plan  # torch, imported when the command runs

        plan = Plan.load(args.plan)
        loaded = load_model_file(args.model)
        if plan.pipeline is not None:
            from autoplan.cli.verify_pipelined import verify_pipelined

            return 0 if verify_pipelined(args, plan, loaded, say) else MISMATCH_STATUS
        from autoplan.dtensor import context_attention

        # A plan with a context axis is checked against the model traced under that axis's
        # attention rule, as it was planned (apply_plan runs its step with the axis itself).
        layout = plan.context_parallel
        with context_attention.active(None if layout is None else layout.axis_index):
            plan, result, eager = _count_collectives(args, plan, loaded, say)
    world = math.prod(plan.mesh_shape)
    how = f", compiled ({args.compile}, {args.backend})" if args.compile else ""
    print(f"plan {args.plan} for {loaded.name}: one training step on a fake process group of {world} ranks{how}")
    from autoplan.cost.regime import regime_mismatch

    mismatch = regime_mismatch(plan.regime, args.compile or "none")
    if mismatch:
        print(f"warning: {mismatch}")
    elif args.compile:
        print(f"compiled {args.compile}: the regime the plan's step is priced for")
    if result.fallback:
        print(f"collectives counted on real tensors, not fake ones: {result.fallback}")
    print(result.summary(all_rows=args.all))
    passed = result.passed
    if args.compile:
        error = abs(result.loss - eager.loss) / max(abs(eager.loss), 1e-30)
        ok = error <= args.tolerance
        print(
            f"loss compiled {result.loss:.8g}, eager {eager.loss:.8g}: rel. error {error:.2e} "
            + ("(ok)" if ok else f"(MISMATCH: above {args.tolerance:g})")
        )
        passed = passed and ok
    if args.numerics:
        passed = _check_numerics(args, plan, loaded, world) and passed
    return 0 if passed else MISMATCH_STATUS


def _count_collectives(args, plan, loaded, say):
    """(The plan, with a hand-written recompute set's repeats added; the Verification of its
    step; the eager step's for --compile, else None). On fake tensors at the real shapes,
    but for --compile, whose losses are compared."""
    import torch

    # Imported here so that flag and file errors are reported without loading torch.distributed.
    from autoplan.evaluate.score import check_plan_for_model
    from autoplan.verify.numerics import build_seeded, seeded_batch, without_randomness
    from autoplan.verify.step_check import verify_plan

    say("tracing the model to check the plan against it")
    check_plan_for_model(loaded.model, loaded.example_inputs, plan, loaded.loss_fn, command="verify")
    if plan.recompute:
        from autoplan.evaluate.recompute import with_recompute_prediction

        say("predicting the collectives of the plan's recompute set")
        # The plan's tables count the recompute set it was built with; a set written in by
        # hand would leave them short of its repeats (evaluate/recompute.py): add them.
        plan = with_recompute_prediction(loaded.model, loaded.example_inputs, plan, loaded.loss_fn)
        modes = ", ".join(f"{fqn} {mode}" for fqn, mode in sorted(plan.recompute.items()))
        print(f"recompute ({modes}): collectives predicted again for this recompute set")
    module = import_model_file(loaded.path)
    batch = seeded_batch(module, 1)
    loss_fn = loss_function(module, loaded.path)

    def real_model():
        say("building the model with real weights")
        return build_seeded(module, loaded.builder, 0)

    with _fake_world(plan) as device_mesh:
        if args.compile:
            # Both steps with the model's randomness off (dropout, stochastic depth), as
            # --numerics runs them: compiled code draws other random numbers than eager code.
            with without_randomness():
                result = verify_plan(real_model(), batch, plan, device_mesh, loss_fn=loss_fn, compile_mode=args.compile,
                                     backend=args.backend, progress=say)
                say("the eager step, for its loss")
                eager = verify_plan(real_model(), batch, plan, device_mesh, loss_fn=loss_fn, tensors="real", progress=say)
            return plan, result, eager
        with torch.device("meta"):  # its twin on fake tensors is counted: no weights are made
            shapes_only = build_seeded(module, loaded.builder, 0)
        result = verify_plan(shapes_only, batch, plan, device_mesh, loss_fn=loss_fn, tensors="fake", real_model=real_model,
                             progress=say)
    return plan, result, None


def _check_numerics(args, plan, loaded, world: int) -> bool:
    """Run the step for real on ``world`` gloo processes against one device; print the verdict
    and how long it took. Says first what it costs: every process builds the whole model."""
    import time

    from autoplan.explain.show import nbytes
    from autoplan.verify.numerics import NumericsJob, check_numerics

    parameters = sum(p.numel() for p in loaded.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    # Each process holds the planned model's shards, the whole one-device reference and its
    # float64 copy, each with its gradients: about 2 + 2 + 4 times the float32 weights.
    print(
        f"autoplan: --numerics runs the real step (real compute) on {world} gloo processes, each building the "
        f"whole model ({parameters / 1e6:.1f} M parameters, {nbytes(weights)}) with a reference copy: "
        f"about {nbytes(8 * weights)} per process; minutes for a large model",
        file=sys.stderr, flush=True,
    )
    started = time.monotonic()
    worst = check_numerics([NumericsJob(str(loaded.path), loaded.builder, plan.to_json())], world)[0]
    took = time.monotonic() - started
    ok = worst.worst <= args.tolerance
    print(
        f"numerics on {world} gloo processes: loss rel. error {worst.loss:.2e}, "
        f"worst gradient/buffer rel. error {worst.worst:.2e} ({worst.worst_name}) "
        + ("(ok)" if ok else f"(MISMATCH: above {args.tolerance:g})")
        + f"; real compute took {took:.1f} s"
    )
    return ok


@contextmanager
def _fake_world(plan):
    """A fake process group of the plan's world size and its mesh (``verify/fake_world.py``):
    the step as it runs on a CPU mesh, whose all_gathers the verdict expects for the plan's all_to_alls."""
    import torch.distributed as dist

    from autoplan.verify.fake_world import fake_world

    if dist.is_initialized():
        raise PlanError(
            "a process group is already initialised in this process",
            hint="run `autoplan verify` as a plain command, not under torchrun: it sets up its own fake process group",
        )
    with fake_world(plan.mesh_shape, plan.axis_names) as mesh:
        yield mesh
