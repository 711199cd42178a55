"""``autoplan verify`` for a plan with pipeline stages: the step runs on gloo processes.

A fake process group plays one rank in one process; a pipeline's ranks hand each other
activations and gradients, so its step runs for real, one gloo process per device of the
full mesh (``verify/pipeline_numerics.py``). Every rank counts its collectives and
point-to-point ops, compared with what the plan predicts for its pipeline rank
(``verify/pipeline_counts.py``); with --numerics the loss and gradients are compared with
one device too.
"""

from __future__ import annotations

import math
import sys
import time


def verify_pipelined(args, plan, loaded, say) -> bool:
    from autoplan.verify.numerics import NumericsJob, check_numerics
    from autoplan.verify.pipeline_counts import (
        pipeline_rank_of,
        planner_p2p_problems,
        predicted_counts_on_cpu,
        without_bytes,
    )
    from autoplan.verify.step_check import compare

    pipeline = plan.pipeline
    shape, names = pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    world = math.prod(shape)
    print(
        f"autoplan: a pipelined plan's step runs for real on {world} gloo processes ({'x'.join(map(str, shape))}, "
        f"axes {', '.join(names)}), each building the whole model with a reference copy",
        file=sys.stderr, flush=True,
    )
    say(f"running the pipelined step on {world} gloo processes")
    started = time.monotonic()
    result = check_numerics([NumericsJob(str(loaded.path), loaded.builder, plan.to_json())], world)[0]
    took = time.monotonic() - started
    print(f"plan {args.plan} for {loaded.name}: {pipeline.schedule}, {len(pipeline.stages)} stages on "
          f"{pipeline.size} pipeline ranks, {pipeline.microbatches} microbatches; one step on {world} gloo processes "
          f"({took:.1f} s)")
    passed = True
    shown: set[int] = set()
    for rank, observed in enumerate(result.counts):
        pp_rank = pipeline_rank_of(plan, rank)
        verification = compare(predicted_counts_on_cpu(plan, pp_rank), without_bytes(observed))
        if not verification.passed or verification.moved or pp_rank not in shown:
            shown.add(pp_rank)
            print(f"rank {rank} (pipeline rank {pp_rank}, stages {list(pipeline.stages_of(pp_rank))}): counts only")
            print(verification.summary(all_rows=args.all))
        passed = passed and verification.passed
    for problem in planner_p2p_problems(plan, result.counts):
        print(f"MISMATCH: {problem}")
        passed = False
    if args.numerics:
        ok = result.worst <= args.tolerance
        print(
            f"numerics on {world} gloo processes: loss rel. error {result.loss:.2e}, "
            f"worst gradient/buffer rel. error {result.worst:.2e} ({result.worst_name}) "
            + ("(ok)" if ok else f"(MISMATCH: above {args.tolerance:g})")
        )
        passed = passed and ok
    return passed
