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
        iters = self._iterations(op)
        per_call = [self._repeat(op, iters) for _ in range(self.sweep.repeats)]
        return statistics.median(self.agree_max(per_call))

    def seconds_and_added(self, base: Callable[[], object], more: Callable[[], object]) -> tuple[float, float]:
        """(``seconds(base)``, the time ``more`` takes over ``base`` per call): the two are
        timed in alternate repeats, so that both see the same load, and the added time is
        the median of the repeats' differences. Timed apart, a load that came and went
        between them (other processes on shared cores) could hide what ``more`` adds."""
        base_iters, more_iters = self._iterations(base), self._iterations(more)
        base_s, more_s = [], []
        for _ in range(self.sweep.repeats):
            base_s.append(self._repeat(base, base_iters))
            more_s.append(self._repeat(more, more_iters))
        base_s, more_s = self.agree_max(base_s), self.agree_max(more_s)
        return statistics.median(base_s), statistics.median(m - b for b, m in zip(base_s, more_s))

    def _iterations(self, op: Callable[[], object]) -> int:
        """Warm ``op`` up; the calls per repeat that fill the sweep's target time (every rank
        agrees on it)."""
        for _ in range(self.sweep.warmup):
            op()
        self._sync()
        start = time.perf_counter()
        op()
        self._sync()
        first = self.agree_max([time.perf_counter() - start])[0]
        return max(1, min(self.sweep.max_iters, math.ceil(self.sweep.target_s / max(first, 1e-9))))

    def _repeat(self, op: Callable[[], object], iters: int) -> float:
        """This rank's time per call of ``op`` over ``iters`` calls, every rank starting together."""
        self.agree_max([0.0])  # barrier: every rank starts the repeat together
        start = time.perf_counter()
        for _ in range(iters):
            op()
        self._sync()
        return (time.perf_counter() - start) / iters

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks (also a barrier)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
