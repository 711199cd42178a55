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
from collections.abc import Callable
from dataclasses import dataclass

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

    def seconds_of_parts(self, first: Callable[[], object], then: Callable[[object], object]) -> tuple[float, float]:
        """(time per call of ``first``, of ``then(first())``), medians over repeats of the
        slowest rank's: every call times both parts, so both see the same load, and
        ``then`` (a backward) is timed itself. Timed as the difference of ``first`` and
        ``first`` + ``then`` instead, a load that came and went on shared cores put it at
        zero (a CI run: 4 gloo ranks beside 4 test workers on 2 cores)."""
        iters = self._iterations(lambda: then(first()))
        first_s, then_s = [], []
        for _ in range(self.sweep.repeats):
            spent_first, spent_then = self._repeat_parts(first, then, iters)
            first_s.append(spent_first)
            then_s.append(spent_then)
        return statistics.median(self.agree_max(first_s)), statistics.median(self.agree_max(then_s))

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

    def _repeat_parts(self, first, then, iters: int) -> tuple[float, float]:
        """This rank's time per call of ``first`` and of ``then`` on its result, over ``iters`` calls."""
        self.agree_max([0.0])  # barrier: every rank starts the repeat together
        spent_first = spent_then = 0.0
        for _ in range(iters):
            start = time.perf_counter()
            made = first()
            self._sync()
            middle = time.perf_counter()
            then(made)
            self._sync()
            spent_first += middle - start
            spent_then += time.perf_counter() - middle
        return spent_first / iters, spent_then / iters

    def agree_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks (also a barrier)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
