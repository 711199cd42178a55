"""``autoplan calibrate``: measure this cluster and write a cluster profile.

Two ways to launch it:

    torchrun --nproc-per-node 8 [--nnodes ...] -m autoplan calibrate --mesh 2x4 --out cost_models/NAME.json
    autoplan calibrate --spawn 8 --mesh 2x4 --out cost_models/NAME.json      # one host, 127.0.0.1

Under torchrun every rank runs this command (rank, world size and rendezvous come from
its environment); with ``--spawn N`` this process starts N ranks itself. On a machine with
one device there is no collective to measure: ``--mesh 1 --links-from h100-sxm`` measures
the device's compute and eager costs and takes the links (and devices per node) from the
named profile, saying so in the provenance. Everything that
can be checked before the sweep (mesh, axis names, world size, backend, the --out path)
is, so a bad flag costs seconds, not a sweep.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import contextmanager

from autoplan.errors import AutoplanError, MeshError
from autoplan.model_file import parse_axis_names, parse_mesh

BACKENDS = ("gloo", "nccl")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this cluster and write a cluster profile",
        description="Time collectives on each mesh axis, matmuls and memory-bound ops on every rank, "
        "fit latency/bandwidth and efficiency curves, and write a cluster profile (JSON). "
        "Launch under torchrun, one process per device, or pass --spawn N to start N ranks on this host.",
    )
    parser.add_argument("--mesh", required=True, help="mesh shape, sizes joined by x, e.g. 2x4")
    parser.add_argument("--axis-names", help="comma-separated mesh axis names, e.g. dp,tp")
    parser.add_argument("--out", required=True, help="profile file to write, e.g. cost_models/mycluster.json")
    parser.add_argument(
        "--backend", choices=BACKENDS, help="process-group backend (default: nccl with CUDA, else gloo)"
    )
    parser.add_argument(
        "--links-from", metavar="PROFILE",
        help="with --mesh 1 (one device, no collective to measure): take the links and devices per node "
        "from this profile (a name in cost_models/ or a path), measure compute only",
    )
    parser.add_argument("--quick", action="store_true", help="a small sweep (seconds), for tests")
    parser.add_argument(
        "--spawn", type=_positive_int, metavar="N", help="start N ranks on this host instead of running under torchrun"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    # Imported here so that `autoplan --help` and flag errors do not wait for torch.distributed.
    from autoplan.calibrate.launch import CalibrateConfig, calibrate_rank, check_out_path, spawn_calibration

    mesh = parse_mesh(args.mesh)
    axis_names = parse_axis_names(args.axis_names, mesh)
    one_device = all(size == 1 for size in mesh)
    if one_device and args.links_from is None:
        raise MeshError(
            f"mesh {args.mesh} has no axis with more than one device: there is no collective to measure",
            "calibrate on the mesh you will plan for, e.g. --mesh 2x4, or measure this device's compute "
            "alone with --links-from PROFILE (e.g. --links-from h100-sxm) for the links",
        )
    if not one_device and args.links_from is not None:
        raise MeshError(
            f"--links-from is for a one-device run, and mesh {args.mesh} has collectives to measure",
            "drop --links-from (the run measures this mesh's links), or pass --mesh 1",
        )
    links_from = _links_source(args.links_from) if one_device else None
    config = CalibrateConfig(mesh, axis_names, args.out, _backend(args.backend, args.spawn), args.quick, links_from)
    if args.spawn is not None:
        _check_world(mesh, args.spawn, f"--spawn {args.spawn}")
        check_out_path(args.out, _links_file(args.links_from))
        with _interruptible(show=True):
            spawn_calibration(config, args.spawn)
        _print_summary(args.out)
        return 0
    rank, world_size, local_rank = _torchrun_env(args.mesh)
    from autoplan._processes import die_with_parent

    die_with_parent(os.getppid())  # torchrun's agent: if it is killed, this rank goes too
    _check_world(mesh, world_size, f"WORLD_SIZE={world_size}")
    if rank == 0:
        check_out_path(args.out, _links_file(args.links_from))  # torchrun stops the other ranks when this one fails
    with _interruptible(show=rank == 0):
        calibrate_rank(config, rank, world_size, "env://", local_rank)
    if rank == 0:
        _print_summary(args.out)
    return 0


@contextmanager
def _interruptible(show: bool):
    """Ctrl-C: one line instead of a traceback per rank, and the usual exit status 130."""
    try:
        yield
    except KeyboardInterrupt:
        if show:
            print("autoplan: calibrate interrupted; no profile was written", file=sys.stderr)
        raise SystemExit(130) from None


def _links_source(name_or_path: str):
    """The profile whose links a one-device run copies, checked before measuring."""
    from autoplan.calibrate.profile_writer import LinksSource
    from autoplan.cost.profile import load_profile

    return LinksSource.of(load_profile(name_or_path))


def _links_file(links_from: str | None):
    from autoplan.cost.profile import profile_path

    return profile_path(links_from) if links_from else None


def _backend(requested: str | None, spawn: int | None) -> str:
    import torch

    cuda = torch.cuda.is_available()
    backend = requested or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise AutoplanError("--backend nccl needs CUDA GPUs, and torch sees none", "use --backend gloo on CPU")
    if backend == "nccl" and spawn is not None and torch.cuda.device_count() < spawn:
        raise AutoplanError(
            f"--spawn {spawn} with nccl needs {spawn} GPUs, torch sees {torch.cuda.device_count()}",
            "spawn at most one rank per GPU, or use --backend gloo",
        )
    return backend


def _torchrun_env(mesh_text: str) -> tuple[int, int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        raise AutoplanError(
            "calibrate runs one process per device and none was started (no RANK / WORLD_SIZE in the environment)",
            f"launch it as `torchrun --nproc-per-node N -m autoplan calibrate --mesh {mesh_text} ...`, "
            "or pass --spawn N to start N ranks on this host",
        ) from None


def _check_world(mesh: tuple[int, ...], world_size: int, source: str) -> None:
    needed = math.prod(mesh)
    if world_size != needed:
        shape = "x".join(map(str, mesh))
        raise MeshError(
            f"mesh {shape} needs {needed} processes, got {source}",
            f"start {needed} processes (nodes x processes per node), or pass a mesh whose sizes multiply to {world_size}",
        )


def _print_summary(out: str) -> None:
    from autoplan.cost.profile import load_profile

    profile = load_profile(out)
    prov = profile.provenance
    print(f"calibrated mesh {'x'.join(map(str, prov['mesh']))} ({', '.join(prov['axis_names'])}), "
          f"{prov['backend']}, {profile.device_name}, in {prov['wall_time_s']:.0f} s")
    if "links_from" in prov:
        print(f"  links and devices per node from profile {prov['links_from']} (one device: no collective measured)")
    for name, per_kind in prov["fits"]["axes"].items():
        for kind, fit in per_kind.items():
            print(f"  {name:>6} {kind:<15} latency {fit['latency_s'] * 1e6:9.1f} us  "
                  f"bus bandwidth {fit['bus_bandwidth_bytes_per_s'] / 1e9:8.3f} GB/s  fit error {fit['rel_rms']:.0%}")
    peaks = ", ".join(f"{dtype} {flops / 1e9:.4g} GFLOP/s" for dtype, flops in profile.peak_flops.items())
    fits = prov["fits"]
    print(f"  matmul peak {peaks}; efficiency max {profile.matmul_efficiency.max:.3g}, "
          f"half at {profile.matmul_efficiency.half_at:.3g} FLOP (fit error {fits['matmul']['rel_rms']:.0%})")
    print(f"  memory {profile.memory_bandwidth_bytes_per_s / 1e9:.4g} GB/s; efficiency max "
          f"{profile.memory_efficiency.max:.3g}, half at {profile.memory_efficiency.half_at:.3g} B "
          f"(fit error {fits['memory']['rel_rms']:.0%}); per-op overhead {profile.kernel_overhead_s * 1e6:.1f} us")
    d = profile.dispatch
    print(f"  DTensor eager: {d.forward_op_s * 1e6:.1f} us per forward op, {d.backward_op_s * 1e6:.1f} us of backward per "
          f"forward op; AdamW {d.optimizer_param_s * 1e6:.1f} us per parameter + {d.optimizer_bytes_per_s / 1e9:.3g} GB/s "
          f"(fit error {fits['optimizer']['rel_rms']:.0%})")
    if d.op_classes:
        per_class = ", ".join(f"{name} {c.forward_op_s * 1e6:.0f} + {c.backward_op_s * 1e6:.0f}" for name, c in d.op_classes.items())
        print(f"  per op class, us forward + backward: {per_class}")
    node = f"{profile.devices_per_node} ranks per host"
    if "links_from" in prov:
        node = f"{profile.devices_per_node} devices per node (from {prov['links_from']})"
    print(f"  device memory {profile.memory_bytes / 2**30:.1f} GiB per rank, {node}")
    print(f"profile written to {out}")


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)
