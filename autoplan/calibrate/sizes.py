"""What a calibration run measures: message sizes, matmul shapes, memory-op sizes, repeats.

The sizes bracket what plans move and compute. Collective messages run from a few KiB
(where latency dominates) to sizes where bandwidth does, twice apart; on a GPU they
reach 256 MiB, where NCCL's bus bandwidth has long flattened. Matmul shapes run from
kernel-launch-bound to the large square GEMMs that reach peak; memory-bound ops from one
cache line's worth to far past the last-level cache.

A CPU run shares its cores between every rank of the host (8 gloo processes on 2 cores
here), so its largest sizes are kept small enough that the whole sweep takes minutes.
Every point runs for about ``target_s`` per repeat (more iterations for fast ops), so
small sizes are not lost in timer noise, a rank descheduled for a moment is averaged
out rather than taken as the slowest rank's time, and large sizes do not dominate the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class Sweep:
    """One calibration run's sizes and repetition counts."""

    message_bytes: tuple[int, ...]
    """Nominal collective sizes, nccl-tests convention (the real size is rounded to the group)."""
    matmul_shapes: tuple[tuple[int, int, int], ...]
    """(m, k, n) of ``(m, k) @ (k, n)``."""
    matmul_dtypes: tuple[str, ...]
    """torch dtype names the matmuls run in ("bfloat16", "float32", ...)."""
    memory_elements: tuple[int, ...]
    """float32 element counts of the memory-bound ops (add, clone)."""
    optimizer_elements: tuple[int, ...]
    """float32 elements per parameter of the timed ``AdamW.step()`` (``dispatch.py``)."""
    warmup: int
    """Untimed calls before each point (allocator, caches, NCCL channels)."""
    repeats: int
    """Timed repeats per point; the median is kept."""
    target_s: float
    """Wall time aimed at per repeat: fast ops run several iterations per repeat."""
    max_iters: int
    """Cap on the iterations per repeat."""
    dispatch_target_s: float
    """Wall time aimed at per repeat of the eager-DTensor op points (``dispatch.py``): longer
    than ``target_s``, since ranks sharing cores run these host-bound ops in scheduler time
    slices, and a short repeat sees whichever rank the scheduler left waiting."""
    compiled: bool = True
    """Measure the fixed costs under ``torch.compile`` (``compiled.py``): a minute of
    compiling on a CPU host; the quick sweep leaves them out (the profile then derives them)."""

    def to_dict(self) -> dict:
        return {
            "message_bytes": list(self.message_bytes),
            "matmul_shapes_mkn": [list(shape) for shape in self.matmul_shapes],
            "matmul_dtypes": list(self.matmul_dtypes),
            "memory_elements": list(self.memory_elements),
            "optimizer_elements": list(self.optimizer_elements),
            "warmup": self.warmup,
            "repeats": self.repeats,
            "target_s_per_repeat": self.target_s,
            "dispatch_target_s_per_repeat": self.dispatch_target_s,
            "compiled": self.compiled,
        }


def _doubling(low: int, high: int) -> tuple[int, ...]:
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


def _square(*sizes: int) -> tuple[tuple[int, int, int], ...]:
    return tuple((s, s, s) for s in sizes)


_GPU_FULL = Sweep(
    message_bytes=_doubling(4 * KIB, 256 * MIB),
    # Square GEMMs up to peak, plus the tall-skinny shapes of tokens x hidden layers.
    matmul_shapes=_square(256, 512, 1024, 2048, 4096, 8192) + ((16384, 4096, 1024), (16384, 1024, 4096)),
    matmul_dtypes=("bfloat16", "float16", "float32"),
    memory_elements=_doubling(4 * KIB, 256 * MIB),
    optimizer_elements=(256, 16 * KIB, 1 * MIB, 16 * MIB),
    warmup=3,
    repeats=5,
    target_s=0.02,
    max_iters=2000,
    dispatch_target_s=0.05,
)
_CPU_FULL = Sweep(
    message_bytes=_doubling(4 * KIB, 16 * MIB),
    matmul_shapes=_square(32, 64, 96, 128, 192, 256, 384, 512, 768, 1024) + ((2048, 256, 256), (512, 1024, 128)),
    matmul_dtypes=("float32",),
    memory_elements=_doubling(1 * KIB, 4 * MIB),
    optimizer_elements=(256, 4 * KIB, 64 * KIB, 1 * MIB),
    warmup=2,
    repeats=7,
    target_s=0.02,
    max_iters=5000,
    dispatch_target_s=0.25,
)
_QUICK = Sweep(
    message_bytes=(4 * KIB, 64 * KIB, 1 * MIB),
    matmul_shapes=_square(32, 64, 128),
    matmul_dtypes=("float32",),
    memory_elements=(1 * KIB, 16 * KIB, 256 * KIB),
    optimizer_elements=(256, 16 * KIB),
    warmup=1,
    repeats=2,
    target_s=0.002,
    max_iters=5,
    dispatch_target_s=0.002,
    compiled=False,
)


def sweep_for(device_type: str, quick: bool) -> Sweep:
    """The sweep for a device type ("cuda" or "cpu"); ``quick`` is a small one for tests."""
    if quick:
        if device_type == "cuda":
            return replace(_QUICK, matmul_dtypes=("bfloat16", "float32"))
        return _QUICK
    return _GPU_FULL if device_type == "cuda" else _CPU_FULL

