"""Planning expert parallel at scale: DeepSeek-V3 as shipped (HuggingFace ``DeepseekV3Config()``:
width 7168, 61 layers of which the first 3 dense, 256 routed experts of 2048 and one shared,
top-8) on 256 devices of the ``h100-sxm`` profile, bf16, built on meta.

    python benchmarks/expert_parallel_scale.py [--mesh 8x32] [--batch 256] [--seq 4096]

Prints the planning time (wall and CPU seconds of ``autoplan.suggest(..., expert_parallel=True)``
in this process, the model built beforehand), the experts' layout chosen, the predicted step
and peak memory per device, and the line that says what the experts' other layout costs.

Recorded 2026-11-29 on the two-core development machine (shared, load 10-14), with the
experts' layout a decision of the solver (docs/expert-parallel.md): at the default batch
(256 x 4096) no plan, with or without expert parallel: the smallest possible peak is
6708 GiB per device with the experts split (7799 GiB as their ops), what remains being
HuggingFace's multi-head latent attention, run eagerly with its per-head queries, keys
and scores held whole (about 117 KB per token and layer); 1460 s wall, 177 s CPU (both
plannings, 61 untied layers each). With ``--batch 4 --seq 256`` (1024 tokens, whose lower
bound of memory is about 42 GiB per device) the run had not finished after 70 min wall and
18 min CPU on that loaded machine, and was stopped; no figure is recorded for it.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

import autoplan
from autoplan.errors import AutoplanError
from autoplan.plan.expert_parallel import EXPERT_NOTE, expert_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="8x32", help="dp x ep mesh of 256 devices (default 8x32)")
    parser.add_argument("--batch", type=int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence (default 4096)")
    args = parser.parse_args()
    mesh = tuple(int(n) for n in args.mesh.split("x"))
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(DeepseekV3Config()).to(torch.bfloat16)
        ids = torch.randint(0, 129280, (args.batch, args.seq))
        batch = {"input_ids": ids, "labels": ids}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan = autoplan.suggest(model, batch, mesh=mesh, axis_names=("dp", "ep"), profile="h100-sxm", cache=False,
                                expert_parallel=True)
    except AutoplanError as err:  # the solved layout must fit before expert parallel is priced against it
        print(f"no plan after {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU: {err}")
        return
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    p = plan.predicted
    print(f"DeepSeek-V3 (61 layers, 256 experts, top-8), batch {args.batch} x {args.seq}, bf16, mesh {args.mesh}, h100-sxm")
    print(f"planning: {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"experts: {expert_rows(plan) or 'solved layout (not expert parallel)'}")
    print(f"predicted step {p.step_time_s * 1e3:.1f} ms (compute {p.compute_s * 1e3:.1f}, communication "
          f"{p.comm_s * 1e3:.1f}), peak {p.peak_memory_bytes / 2**30:.2f} GiB per device")
    for line in plan.warnings:
        if line.startswith(EXPERT_NOTE):
            print(line)


if __name__ == "__main__":
    main()
