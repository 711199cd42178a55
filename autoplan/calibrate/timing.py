"""Timing one operation on every rank at once, the way a training step runs it.

All ranks start each timed repeat together (a one-element all-reduce on the world is the
barrier), so concurrent groups of a mesh axis and ranks sharing CPU cores contend as they
do in a real step. The time kept for a repeat is the slowest rank's: in SPMD training the
step waits for it. The point's time is the median over repeats, robust to one stall.

Fast ops run several back-to-back iterations per repeat (all ranks agree on the count, as
they must for collectives), so the timer's resolution and the barrier's skew vanish.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from autoplan.calibrate.sizes import Sweep


@dataclass(frozen=True, slots=True)
class Timer:
    """Times ops on every rank with the sweep's warmup, repeats and per-repeat target."""

    device: torch.device
    """Where the ops run: the barrier tensor lives there, and CUDA is synchronised."""
    sweep: Sweep
    """Warmup, repeats, target time and iteration cap."""

    def seconds(self, op: Callable[[], object]) -> float:
        """Median over repeats of the slowest rank's time per call of ``op``."""
        for _ in range(self.sweep.warmup):
            op()
        self._sync()
        start = time.perf_counter()
        op()
        self._sync()
        first = self.agree_max([time.perf_counter() - start])[0]
        iters = max(1, min(self.sweep.max_iters, math.ceil(self.sweep.target_s / max(first, 1e-9))))
        per_call = []
        for _ in range(self.sweep.repeats):
            self.agree_max([0.0])  # barrier: every rank starts the repeat together
            start = time.perf_counter()
            for _ in range(iters):
                op()
            self._sync()
            per_call.append((time.perf_counter() - start) / iters)
        return statistics.median(self.agree_max(per_call))

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks (also a barrier)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
