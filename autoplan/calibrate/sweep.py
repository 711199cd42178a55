"""Measurements: collectives on each mesh axis, matmuls, memory-bound ops, per-op overhead,
and the fixed costs of eager DTensor execution (``dispatch.py``).

Collectives are timed through DTensor's own ``redistribute`` on the real device mesh, the
call an applied plan makes at module boundaries, so the timings include what plans pay:
DTensor's dispatch, the functional collective and its wait, and on CPU the fallbacks
DTensor takes (it runs all_to_all as all_gather + chunk on gloo). Each collective is one
placement change on one axis, every other axis replicated:

    kind            src (axis)   dst (axis)   bytes (nccl-tests convention)
    all_reduce      P(sum)       R            the local buffer
    all_gather      S(0)         R            the gathered output: n x the local shard
    reduce_scatter  P(sum)       S(0)         the local input
    all_to_all      S(0)         S(1)         the local buffer

Every group of an axis runs at once (a 2x4 mesh's tp axis is two groups of four), as in
a step. Compute ops run on every rank at once too, so ranks sharing a host's cores or
memory bandwidth are measured sharing them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from autoplan.calibrate.compiled import CompiledSample, count_compiled_points, measure_compiled
from autoplan.calibrate.dispatch import DispatchSample, count_dispatch_points, measure_dispatch
from autoplan.calibrate.progress import Progress
from autoplan.calibrate.sizes import Sweep
from autoplan.calibrate.timing import Timer
from autoplan.cost.profile import COLLECTIVES

COMM_DTYPE = torch.float32
MEMORY_OPS = ("add", "clone")
# (src, dst) placement on the measured axis, per collective; see the table above.
_PLACEMENTS: dict[str, tuple[Placement, Placement]] = {
    "all_reduce": (Partial(), Replicate()),
    "all_gather": (Shard(0), Replicate()),
    "reduce_scatter": (Partial(), Shard(0)),
    "all_to_all": (Shard(0), Shard(1)),
}


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One collective on one mesh axis at one size."""

    axis: int
    """Mesh axis (index) the collective ran on."""
    kind: str
    """all_reduce, all_gather, reduce_scatter or all_to_all."""
    group_size: int
    """Ranks per group on that axis."""
    nbytes: int
    """Message size, nccl-tests convention (see the module docstring)."""
    seconds: float
    """Median over repeats of the slowest rank's time per call."""


@dataclass(frozen=True, slots=True)
class MatmulSample:
    """One ``(m, k) @ (k, n)`` matmul."""

    dtype: str
    """torch dtype name."""
    shape: tuple[int, int, int]
    """(m, k, n)."""
    flops: float
    """2 m k n."""
    seconds: float
    """Time per call, as for collectives."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One memory-bound op over float32 tensors."""

    op: str
    """"add" (reads two tensors, writes one) or "clone" (reads one, writes one)."""
    elements: int
    """Elements per tensor."""
    nbytes: int
    """Bytes read and written, as the cost stage counts them (inputs + outputs)."""
    seconds: float
    """Time per call, as for collectives."""


@dataclass(frozen=True)
class Measurements:
    """Everything one calibration run measured, identical on every rank."""

    collectives: tuple[CollectiveSample, ...]
    matmuls: tuple[MatmulSample, ...]
    memory_ops: tuple[MemorySample, ...]
    overhead_s: float
    """Time of a one-element add: the fixed cost of any op (``kernel_overhead_s``)."""
    dispatch: DispatchSample
    """Per-op, backward and optimizer fixed costs of DTensor ops on the mesh."""
    compiled: CompiledSample | None = None
    """What remains of them under ``torch.compile``; None where the sweep leaves it out."""


def count_points(mesh_shape: tuple[int, ...], sweep: Sweep) -> int:
    """How many points ``measure_all`` times, for the progress bar."""
    axes = sum(1 for size in mesh_shape if size > 1)
    return (
        axes * len(COLLECTIVES) * len(sweep.message_bytes)
        + len(sweep.matmul_shapes) * len(sweep.matmul_dtypes)
        + len(MEMORY_OPS) * len(sweep.memory_elements)
        + 1
        + count_dispatch_points(sweep.optimizer_elements)
        + (count_compiled_points() if sweep.compiled else 0)
    )


def measure_all(mesh: DeviceMesh, sweep: Sweep, timer: Timer, progress: Progress) -> Measurements:
    """Run the whole sweep on every rank; every rank returns the same figures."""
    with torch.no_grad(), _quiet_dtensor_fallback_warning():
        collectives = measure_collectives(mesh, sweep, timer, progress)
        overhead = measure_overhead(timer, progress)
        matmuls = measure_matmuls(sweep, timer, progress)
        memory_ops = measure_memory_ops(sweep, timer, progress)
        dispatch = measure_dispatch(mesh, sweep.optimizer_elements, timer, progress)
    compiled = None
    if sweep.compiled:
        compiled_timer = replace(timer, sweep=replace(timer.sweep, target_s=timer.sweep.dispatch_target_s))
        compiled = measure_compiled(mesh, compiled_timer, progress)
    return Measurements(tuple(collectives), tuple(matmuls), tuple(memory_ops), overhead, dispatch, compiled)


def measure_collectives(mesh: DeviceMesh, sweep: Sweep, timer: Timer, progress: Progress) -> list[CollectiveSample]:
    samples = []
    names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
    for axis, group_size in enumerate(mesh.shape):
        if group_size == 1:
            continue  # nothing moves on a one-device axis; its cost is zero by definition
        for kind in COLLECTIVES:
            for nominal in sweep.message_bytes:
                op, nbytes = _collective_op(mesh, axis, kind, nominal)
                samples.append(CollectiveSample(axis, kind, group_size, nbytes, timer.seconds(op)))
                progress.step(f"{kind} on {names[axis]}, {_format_bytes(nbytes)}")
    return samples


def measure_overhead(timer: Timer, progress: Progress) -> float:
    one = torch.ones(1, device=timer.device)
    seconds = timer.seconds(lambda: torch.add(one, one))
    progress.step("per-op overhead")
    return seconds


def measure_matmuls(sweep: Sweep, timer: Timer, progress: Progress) -> list[MatmulSample]:
    samples = []
    for dtype_name in sweep.matmul_dtypes:
        dtype = getattr(torch, dtype_name)
        for m, k, n in sweep.matmul_shapes:
            a = torch.randn(m, k, device=timer.device, dtype=dtype)
            b = torch.randn(k, n, device=timer.device, dtype=dtype)
            seconds = timer.seconds(functools.partial(torch.mm, a, b))
            samples.append(MatmulSample(dtype_name, (m, k, n), 2.0 * m * k * n, seconds))
            progress.step(f"matmul {dtype_name} {m}x{k}x{n}")
            del a, b
    return samples


def measure_memory_ops(sweep: Sweep, timer: Timer, progress: Progress) -> list[MemorySample]:
    samples = []
    itemsize = torch.finfo(torch.float32).bits // 8
    for elements in sweep.memory_elements:
        x = torch.randn(elements, device=timer.device)
        y = torch.randn(elements, device=timer.device)
        ops: dict[str, tuple[Callable[[], object], int]] = {"add": (functools.partial(torch.add, x, y), 3), "clone": (x.clone, 2)}
        for name in MEMORY_OPS:
            op, tensors = ops[name]
            samples.append(MemorySample(name, elements, tensors * elements * itemsize, timer.seconds(op)))
            progress.step(f"{name} {_format_bytes(elements * itemsize)} per tensor")
        del x, y, ops  # the partials hold the tensors too
    return samples


def _collective_op(mesh: DeviceMesh, axis: int, kind: str, nominal_bytes: int):
    """A closure that runs ``kind`` on ``axis`` once, and its size in nccl-tests bytes."""
    n = mesh.shape[axis]
    itemsize = torch.finfo(COMM_DTYPE).bits // 8
    elements = max(1, nominal_bytes // itemsize)
    if kind == "all_gather":
        elements = max(1, elements // n)  # nominal size is the gathered output
    local = torch.ones(_local_shape(elements, n), dtype=COMM_DTYPE, device=mesh.device_type)
    src, dst = _PLACEMENTS[kind]
    placed: list[Placement] = [Replicate()] * mesh.ndim
    source = DTensor.from_local(local, mesh, _with(placed, axis, src), run_check=False)
    target = _with(placed, axis, dst)

    def op():
        out = source.redistribute(mesh, target).to_local()
        if isinstance(out, AsyncCollectiveTensor):
            out = out.wait()
        return out

    local_bytes = local.numel() * itemsize
    return op, local_bytes * n if kind == "all_gather" else local_bytes


def _local_shape(elements: int, n: int) -> tuple[int, int]:
    """A near-square 2-D shape of about ``elements`` whose dims both divide by ``n``.

    Dim 0 must split evenly for reduce_scatter, dim 1 for all_to_all: uneven shards would
    add DTensor's padding to what is measured.
    """
    cols = n * max(1, math.isqrt(elements) // n)
    rows = n * max(1, round(elements / (cols * n)))
    return rows, cols


def _with(placements: list[Placement], axis: int, placement: Placement) -> list[Placement]:
    changed = list(placements)
    changed[axis] = placement
    return changed


def _format_bytes(nbytes: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


class _quiet_dtensor_fallback_warning:
    """DTensor warns once per rank that gloo runs all_to_all as all_gather + chunk.

    That fallback is exactly what is being measured (and is recorded in the profile's
    provenance), so eight copies of the warning would only clutter the progress bar.
    """

    _logger = logging.getLogger("torch.distributed.tensor._collective_utils")

    def __enter__(self):
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self._logger.setLevel(self._level)
