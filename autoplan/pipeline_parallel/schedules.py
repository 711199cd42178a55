"""What a schedule does to a step: its makespan, its bubble, the microbatches it keeps in flight.

``torch.distributed.pipelining``'s schedules, each priced from per-rank forward and backward
times of one microbatch (``F_r``, ``B_r``; ``L_r = F_r + B_r`` over every stage the rank
runs) for ``m`` microbatches on ``p`` ranks with ``v`` stages per rank:

    makespan = m * max_r L_r + rho * (sum_r L_r - max_r L_r) / v

The first term is the busiest rank running every microbatch; the second the fill and drain
of the pipeline, which with equal stages is the textbook bubble ``(p - 1) * L / v`` (GPipe
and 1F1B: ``(m + p - 1) * L``; interleaved: ``(m + (p - 1) / v) * L``, Narayanan et al.
2021). ``rho`` is 1 except for the zero-bubble schedules (Qi et al. 2024), which fill the
bubble with deferred weight gradients ``W`` (taken as half of each backward: a matmul's
backward is one product for the input's gradient and one for the weight's): per stage the
bubble shrinks from ``F + B`` to ``F + B - W`` (``InterleavedZeroBubble``, ZB-H1 looped)
or to ``F + B - 2W`` (``ZBVZeroBubble``), never below zero.

Activations in flight at a rank's peak, in microbatches through all of the rank's stages:
GPipe holds every microbatch (all forwards run first); 1F1B holds ``min(m, p - r)`` on rank
``r``; Interleaved1F1B runs ``min(m v, (v - 1) p + 2 (p - 1 - r))`` warm-up forwards of one
stage each before the first backward (InterleavedZeroBubble ``(v - 1) p + (p - 1 - r)``:
torch's ``_get_warmup_ops`` with its factor 2 or 1 per hop), so they hold one more than
that, in stages, which is that count over ``v`` in microbatches; ZBV's warm-up runs
``2p - 1 - r`` forwards of the rank's first stage and ``p`` of its second (torch's
``ScheduleZBVZeroBubble``), held together, over 2. Weight gradients a zero-bubble
schedule defers keep their inputs a little longer: not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT_GRADIENT_SHARE = 0.5
"""The share of a backward that is the weights' gradient (the part a zero-bubble schedule defers)."""

LOOPED = ("Interleaved1F1B", "InterleavedZeroBubble")
"""Schedules that run ``v`` stages per rank, stage ``i`` on rank ``i % p``."""

SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble")
"""Schedules whose backward is two passes (``ScheduleShape.splits_backward``)."""


@dataclass(frozen=True)
class ScheduleShape:
    """One schedule with its stages per rank."""

    name: str
    virtual: int = 1

    def stage_ranks(self, size: int) -> tuple[int, ...]:
        """The pipeline rank that runs each of the ``size * virtual`` stages, in model order."""
        if self.name == "ZBVZeroBubble":  # a V: down the ranks, then back up
            return tuple(range(size)) + tuple(reversed(range(size)))
        return tuple(i % size for i in range(size * self.virtual))

    @property
    def splits_backward(self) -> bool:
        """Whether the schedule runs a stage's backward as two autograd passes, the input's
        gradient and later the weights' (the zero-bubble ones): torch's checkpoint then
        reruns a checkpointed block's forward in each, twice per microbatch."""
        return self.name in SPLIT_BACKWARD

    def allows(self, size: int, microbatches: int) -> bool:
        """Whether torch's schedule runs ``microbatches`` on ``size`` ranks with this many stages
        per rank (the looped ones need a multiple of the ranks; every one at least as many
        microbatches as ranks, below which the bubble is the step)."""
        if microbatches < size:
            return False
        if self.name in ("GPipe", "1F1B"):
            return self.virtual == 1
        if self.name == "ZBVZeroBubble":  # torch schedules at least 2p - 1 microbatches' worth of warm-up
            return self.virtual == 2 and size >= 2 and microbatches >= 2 * size - 1
        return self.name in LOOPED and self.virtual >= 2 and microbatches % size == 0


def candidate_shapes(max_virtual: int = 4) -> tuple[ScheduleShape, ...]:
    """Every schedule the planner prices, with 2 to ``max_virtual`` stages per rank for the looped ones."""
    shapes = [ScheduleShape("GPipe"), ScheduleShape("1F1B"), ScheduleShape("ZBVZeroBubble", 2)]
    for virtual in range(2, max_virtual + 1):
        shapes += [ScheduleShape("Interleaved1F1B", virtual), ScheduleShape("InterleavedZeroBubble", virtual)]
    return tuple(shapes)


def in_flight(shape: ScheduleShape, size: int, microbatches: int, rank: int) -> float:
    """Microbatches' activations (through all of the rank's stages) rank ``rank`` holds at its peak."""
    m, p, v = microbatches, size, shape.virtual
    if shape.name == "GPipe":
        return float(m)
    if shape.name == "1F1B":
        return float(min(m, p - rank))
    if shape.name == "ZBVZeroBubble":  # warm-up: 2p - 1 - r forwards of its first stage, p of its second
        return (min(m, 2 * p - 1 - rank) + min(m, p)) / 2
    hops = 2 if shape.name == "Interleaved1F1B" else 1  # torch's multiply_factor per hop from the last rank
    warmup = min(m * v, (v - 1) * p + hops * (p - 1 - rank))
    return min(m * v, warmup + 1) / v


@dataclass(frozen=True)
class Makespan:
    seconds: float
    """From the first forward to the last backward (the per-step work after it not included)."""
    bubble_share: float
    """Average share of the makespan the ranks sit idle."""


def makespan(shape: ScheduleShape, forward_s: tuple[float, ...], backward_s: tuple[float, ...], microbatches: int) -> Makespan:
    """The schedule's makespan from each rank's forward and backward seconds per microbatch
    (summed over the rank's stages)."""
    loads = [f + b for f, b in zip(forward_s, backward_s)]
    busiest = max(loads)
    rho = 1.0
    cut = {"InterleavedZeroBubble": 1, "ZBVZeroBubble": 2}.get(shape.name, 0)
    total = sum(loads)
    if cut and total > 0:
        weights = WEIGHT_GRADIENT_SHARE * sum(backward_s)
        rho = max(0.0, total - cut * weights) / total
    seconds = microbatches * busiest + rho * (total - busiest) / shape.virtual
    busy = microbatches * total / len(loads)
    return Makespan(seconds, 1.0 - busy / seconds if seconds > 0 else 0.0)
