"""Plan, apply and train: a small Llama for a few steps on every rank of a torchrun job.

    torchrun --nproc-per-node 8 examples/train.py [--steps 5] [--mesh 2x4] [--memory-gib N | --memory-gb N]
    python examples/train.py --single-device      # the same training on one device

Every rank calls ``autoplan.suggest`` (rank 0 plans, or reuses the plan cached in
``plans_out/cache/``, and every rank gets its plan), builds the model with the same seed,
applies the plan, and trains with ``torch.optim.AdamW(model.parameters())`` on its slice
(``autoplan.shard_batch``) of the global batch. Rank 0 prints the loss per step: the
global-batch loss, the same number the single-device run prints. Every step trains on the
same batch (the model file's random tokens), so the loss falls as the model memorises it. gloo on CPU; NCCL,
one GPU per rank, when CUDA is available.

``--memory-gib`` (2**30 bytes) or ``--memory-gb`` (10**9 bytes) is the per-device budget
the plan must fit; a small one (``--memory-gib 0.0009`` for the tiny Llama) forces the
weights to be sharded on both mesh axes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import autoplan
from autoplan._files import write_atomic
from autoplan.model_file import import_model_file, loss_function, parse_axis_names, parse_mesh
from autoplan.trace.loss import model_loss
from autoplan.verify.numerics import build_seeded, call_model, seeded_batch

DEFAULT_MODEL = Path(__file__).resolve().parent / "llama.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL),
        help="model file with build_model() and example_inputs() (and compute_loss(output, batch), where the loss is its own)",
    )
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--mesh", help="mesh shape, e.g. 2x4 (default: 2xN/2 for an even world size N, else N)")
    parser.add_argument("--axis-names", help="comma-separated mesh axis names (default: dp,tp for 2-D)")
    parser.add_argument("--profile", help="cluster profile (default: cpu-gloo on CPU, h100-sxm on GPUs)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--memory-gib", type=float, help="per-device memory budget for the plan, in GiB (2^30 bytes)")
    budget.add_argument("--memory-gb", type=float, help="per-device memory budget for the plan, in GB (10^9 bytes)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="weights come from SEED, the batch from SEED+1")
    parser.add_argument("--single-device", action="store_true", help="train without a plan, in this process alone")
    parser.add_argument("--losses", help="rank 0 writes the per-step losses here, as a JSON list")
    return parser.parse_args(argv)


def main(argv=None) -> list[float]:
    args = parse_args(argv)
    module = import_model_file(Path(args.model))
    if args.single_device:
        losses = train_single_device(module, args, torch.device("cpu"))
    else:
        losses = train_parallel(module, args)
    if args.losses and (args.single_device or dist.get_rank() == 0):
        write_atomic(args.losses, json.dumps(losses) + "\n")
    if not args.single_device:
        dist.destroy_process_group()
    return losses


def train_parallel(module, args) -> list[float]:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world = dist.get_world_size()
    mesh_shape = parse_mesh(args.mesh) if args.mesh else ((2, world // 2) if world % 2 == 0 and world >= 4 else (world,))
    axis_names = parse_axis_names(args.axis_names, mesh_shape)

    with torch.device("meta"):  # planning needs shapes only
        meta_model = module.build_model()
        meta_batch = module.example_inputs()
    loss_fn = loss_function(module, Path(args.model))
    plan = autoplan.suggest(
        meta_model, meta_batch, mesh=mesh_shape, axis_names=axis_names,
        profile=args.profile or (None if cuda else "cpu-gloo"), memory_gb=args.memory_gb,
        memory_gib=args.memory_gib, loss_fn=loss_fn,
    )
    mesh = init_device_mesh(device.type, mesh_shape, mesh_dim_names=axis_names)
    model = build_seeded(module, "build_model", args.seed).to(device)
    autoplan.apply_plan(model, plan, mesh, loss_fn=loss_fn)  # the model then returns that loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rank0 = dist.get_rank() == 0
    if rank0:
        sharded = sum(any(p.startswith("S(") for p in spec) for spec in plan.parameters.values())
        print(f"plan: mesh {'x'.join(map(str, mesh_shape))} {list(axis_names)}, {sharded} of {len(plan.parameters)} parameters sharded")
    local_batch = autoplan.shard_batch(_to(seeded_batch(module, args.seed + 1), device), plan, mesh)
    return _train(model, optimizer, local_batch, args.steps, show=rank0)


def train_single_device(module, args, device) -> list[float]:
    model = build_seeded(module, "build_model", args.seed).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batch = _to(seeded_batch(module, args.seed + 1), device)
    return _train(model, optimizer, batch, args.steps, show=True, loss_fn=loss_function(module, Path(args.model)))


def _train(model, optimizer, batch, steps: int, show: bool, loss_fn=None) -> list[float]:
    """``steps`` AdamW steps on the same batch; the loss of each (printed when ``show``)."""
    losses = []
    for step in range(steps):
        loss = model_loss(call_model(model, batch), batch, loss_fn)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if show:
            print(f"step {step}  loss {losses[-1]:.6f}", flush=True)
    return losses


def _to(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in batch)


if __name__ == "__main__":
    main()
