"""Every stage split, schedule and microbatch count priced on one layout; the fastest that fits kept.

A candidate is a schedule (``schedules.py``, with its stages per rank), a microbatch count
(a divisor of the batch's sequences per data-parallel rank, at least the pipeline's size)
and the split of the blocks into stages (``partition.py``). Per stage and microbatch, from
the layout's parts (``parts.py``) at the microbatch's sequences:

    forward  = its parts' per-token forward x tokens + per-microbatch forward
               + the send of its output to the next stage on the pipeline axis's link
    backward = the same for the backward + the send of its input's gradient back
               + the forward rerun of the blocks it checkpoints

One stage (``size`` 1) is gradient accumulation: the microbatches run one after the other
on every rank, one microbatch's activations held at a time.

Memory per rank: its stages' parameters, gradients and optimizer state, plus the
activations of the microbatches the schedule keeps in flight there, plus one
microbatch's temporaries; where that exceeds the budget, the fewest blocks of the rank are
checkpointed ("selective" or "full", whichever costs less rerun) to fit, and a rank that
cannot fit with every block checkpointed rules the candidate out. Step time: the
schedule's makespan plus the busiest rank's once-per-step work (optimizer, weight-gradient
reductions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cost.comm import link_cost
from autoplan.pipeline_parallel.mesh_shapes import divisors
from autoplan.pipeline_parallel.partition import split_blocks
from autoplan.pipeline_parallel.parts import LayoutParts, PartCost
from autoplan.pipeline_parallel.schedules import ScheduleShape, candidate_shapes, in_flight, makespan

RECOMPUTE_MODES = ("selective", "full")


@dataclass(frozen=True)
class StagePrice:
    blocks: int
    """How many blocks of the stack the stage holds."""
    first_block: int
    rank: int
    forward_s: float
    """Per microbatch, sends included."""
    backward_s: float
    """Per microbatch, sends and checkpoint reruns included."""
    peak_bytes: float
    """Of the rank running the stage."""
    state_bytes: float
    recompute: str | None = None
    recomputed_blocks: int = 0
    """The first this many of the stage's blocks are checkpointed with ``recompute``."""


@dataclass(frozen=True)
class PipelineOption:
    schedule: ScheduleShape
    size: int
    microbatches: int
    stages: tuple[StagePrice, ...]
    step_s: float
    makespan_s: float
    bubble_share: float
    p2p_s: float
    per_step_s: float
    peak_bytes: float
    fits: bool

    @property
    def stage_count(self) -> int:
        return len(self.stages)


@dataclass(frozen=True)
class FixedStages:
    """A split and checkpointing already chosen (a plan being scored): blocks per stage in
    model order, and per stage the checkpoint mode and how many of its first blocks it
    checkpoints (mode None: none)."""

    blocks: tuple[int, ...]
    recompute: tuple[tuple[str | None, int], ...]


@dataclass(frozen=True)
class PricingInputs:
    """What pricing needs besides the layout: the batch, the budget and the pipeline axis's link."""

    sequences: int
    """The whole batch's dim 0."""
    dp: int
    """Data-parallel ranks in the stage mesh that split the batch (microbatches divide by them)."""
    budget_bytes: float
    send_latency_s: float
    send_bytes_per_s: float
    temporary_bytes: float = 0.0
    """One microbatch's temporaries at the traced batch (the layout's own peak's)."""


def pricing_inputs(profile, full_mesh: tuple[int, ...], axis_index: int, sequences: int, dp: int,
                   budget_bytes: float, temporary_bytes: float = 0.0) -> PricingInputs:
    """A point-to-point send on the pipeline axis priced as one link's latency and bus bandwidth."""
    link = link_cost(profile, "all_gather", full_mesh, axis_index)
    return PricingInputs(sequences, dp, budget_bytes, link.latency_s, link.bus_bandwidth_bytes_per_s, temporary_bytes)


def microbatch_counts(sequences: int, dp: int, size: int) -> tuple[int, ...]:
    """Microbatch counts a batch of ``sequences`` split over ``dp`` ranks allows with ``size`` stages."""
    if sequences % dp:
        return ()
    return tuple(m for m in divisors(sequences // dp) if m >= size)


def best_option(parts: LayoutParts, inputs: PricingInputs, size: int, max_virtual: int = 4,
                options: list[PipelineOption] | None = None) -> PipelineOption | None:
    """The fastest candidate that fits, else the one closest to fitting; None where none prices
    (too few blocks, no microbatch count). ``options`` (when given) collects every candidate priced."""
    best: PipelineOption | None = None
    shapes = candidate_shapes(max_virtual) if size > 1 else (ScheduleShape("1F1B"),)
    for shape in shapes:
        if size * shape.virtual > max(parts.blocks, 1) + 2:
            continue
        for m in microbatch_counts(inputs.sequences, inputs.dp, size):
            if not shape.allows(size, m):
                continue
            option = price_option(parts, inputs, size, shape, m)
            if option is None:
                continue
            if options is not None:
                options.append(option)
            if best is None or _better(option, best):
                best = option
    return best


def _better(a: PipelineOption, b: PipelineOption) -> bool:
    if a.fits != b.fits:
        return a.fits
    return a.step_s < b.step_s if a.fits else a.peak_bytes < b.peak_bytes


def price_option(parts: LayoutParts, inputs: PricingInputs, size: int, shape: ScheduleShape,
                 microbatches: int, checkpoint: str | None = None, fixed: FixedStages | None = None) -> PipelineOption | None:
    """One candidate priced: blocks split by price, each rank's checkpointing fitted to the
    budget, or every block checkpointed with ``checkpoint`` ("full" or "selective": a
    recipe's fixed choice), or the split and checkpointing ``fixed`` gives (a plan scored).
    With ``size`` 1 and several microbatches it is gradient accumulation."""
    tokens = inputs.sequences / microbatches / parts.traced_sequences
    stage_count = size * shape.virtual
    ranks = shape.stage_ranks(size)
    send_s = inputs.send_latency_s + tokens * parts.boundary_bytes / inputs.send_bytes_per_s if size > 1 else 0.0
    flight = [in_flight(shape, size, microbatches, r) for r in range(size)]
    temporaries = tokens * inputs.temporary_bytes

    def stage_parts(stage: int, blocks: int) -> list[tuple[PartCost, float]]:
        found = [(parts.block, float(blocks))]
        if stage == 0:
            found.append((parts.pre, 1.0))
        if stage == stage_count - 1:
            found.append((parts.post, 1.0))
        return found

    def base(stage: int, blocks: int) -> tuple[float, float]:
        forward = backward = 0.0
        for part, times in stage_parts(stage, blocks):
            forward += times * (tokens * part.forward_per_token + part.forward_per_microbatch)
            backward += times * (tokens * part.backward_per_token + part.backward_per_microbatch)
        if size > 1:
            forward += send_s if stage < stage_count - 1 else 0.0
            backward += send_s if stage > 0 else 0.0
        return forward, backward

    def memory(stages: list[tuple[int, int]]) -> tuple[float, float]:
        """(state bytes, activation bytes per microbatch in flight) of stages (index, blocks)."""
        state = activations = 0.0
        for stage, blocks in stages:
            for part, times in stage_parts(stage, blocks):
                state += times * part.state_bytes
                activations += times * tokens * part.activation_bytes
        return state, activations

    def fitted(stages: list[tuple[int, int]], rank: int):
        """(rerun seconds per microbatch, peak, mode, blocks checkpointed) for a rank, or None.
        None too where a schedule that splits its backward would checkpoint: each block would
        rerun twice per microbatch, its collectives too, which neither this price nor the
        plan's prediction (one rerun) counts; such a candidate does not fit."""
        state, activations = memory(stages)
        held = flight[rank]
        peak = state + held * activations + temporaries
        if fixed is not None:
            rerun = freed = 0.0
            for stage, _ in stages:
                mode, count = fixed.recompute[stage]
                if mode is not None and count:
                    freed += count * tokens * getattr(parts.block, f"{mode}_freed") * held
                    rerun += count * _rerun(parts.block, mode, tokens)
            return rerun, peak - freed, None, 0  # the stages' own checkpointing is read from ``fixed`` below
        if shape.splits_backward and (checkpoint is not None or peak > inputs.budget_bytes):
            return None
        if checkpoint is not None:
            blocks = sum(k for _, k in stages)
            freed = blocks * tokens * getattr(parts.block, f"{checkpoint}_freed") * held
            rerun = blocks * _rerun(parts.block, checkpoint, tokens)
            return rerun, peak - freed, checkpoint, blocks  # whether it fits is judged by its peak
        if peak <= inputs.budget_bytes:
            return 0.0, peak, None, 0
        blocks = sum(k for _, k in stages)
        choice = None
        for mode in RECOMPUTE_MODES:
            freed = tokens * getattr(parts.block, f"{mode}_freed") * held
            if freed <= 0:
                continue
            need = math.ceil((peak - inputs.budget_bytes) / freed)
            if need > blocks:
                continue
            rerun = need * _rerun(parts.block, mode, tokens)
            if choice is None or rerun < choice[0]:
                choice = (rerun, peak - need * freed, mode, need)
        return choice

    def stage_seconds(stage: int, blocks: int) -> float:
        forward, backward = base(stage, blocks)
        if shape.virtual > 1:  # memory is the rank's, fitted once the split is known
            return forward + backward
        fit = fitted([(stage, blocks)], ranks[stage])
        return math.inf if fit is None else forward + backward + fit[0]

    ends = (parts.pre.state_bytes > 0, parts.post.state_bytes > 0)  # an end stage needs modules of its own
    if fixed is not None:
        if len(fixed.blocks) != stage_count or sum(fixed.blocks) != parts.blocks:
            return None
        counts: tuple[int, ...] | None = fixed.blocks
    else:
        counts = split_blocks(parts.blocks, stage_count, stage_seconds, ends)
    fits = counts is not None
    if counts is None:  # nothing fits: split by time alone, to say how far over it is
        counts = split_blocks(parts.blocks, stage_count, lambda s, k: sum(base(s, k)), ends)
        if counts is None:
            return None
    starts = [sum(counts[:i]) for i in range(stage_count)]
    prices: list[StagePrice | None] = [None] * stage_count
    rank_forward, rank_backward, rank_step = [0.0] * size, [0.0] * size, [0.0] * size
    for rank in range(size):
        mine = [i for i in range(stage_count) if ranks[i] == rank]
        fit = fitted([(i, counts[i]) for i in mine], rank)
        if fit is None:
            fits = False
            state, activations = memory([(i, counts[i]) for i in mine])
            fit = (0.0, state + flight[rank] * activations + temporaries, None, 0)
        rerun, peak, mode, left = fit
        fits = fits and peak <= inputs.budget_bytes
        for i in mine:
            forward, backward = base(i, counts[i])
            if fixed is not None:
                mode, checkpointed = fixed.recompute[i]
                extra = checkpointed * _rerun(parts.block, mode, tokens) if mode is not None else 0.0
            else:
                checkpointed = min(left, counts[i])
                left -= checkpointed
                extra = rerun * checkpointed / fit[3] if fit[3] else 0.0
            state, _ = memory([(i, counts[i])])
            prices[i] = StagePrice(counts[i], starts[i], rank, forward, backward + extra, peak, state,
                                   mode if checkpointed else None, checkpointed)
            rank_forward[rank] += forward
            rank_backward[rank] += backward + extra
            rank_step[rank] += sum(times * part.per_step for part, times in stage_parts(i, counts[i]))
    span = makespan(shape, tuple(rank_forward), tuple(rank_backward), microbatches)
    unsent = makespan(shape, *_without_sends(prices, size, send_s, stage_count), microbatches)
    per_step = max(rank_step)
    stages = tuple(p for p in prices if p is not None)
    peak = max(p.peak_bytes for p in stages)
    return PipelineOption(shape, size, microbatches, stages, span.seconds + per_step, span.seconds,
                          span.bubble_share, span.seconds - unsent.seconds, per_step, peak, fits)


def _rerun(block: PartCost, mode: str, tokens: float) -> float:
    """One checkpointed block's rerun per microbatch of ``tokens`` (a share of the traced batch)."""
    return tokens * getattr(block, f"{mode}_rerun") + getattr(block, f"{mode}_rerun_per_microbatch")


def _without_sends(prices, size: int, send_s: float, stage_count: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    forward, backward = [0.0] * size, [0.0] * size
    for i, p in enumerate(prices):
        forward[p.rank] += p.forward_s - (send_s if i < stage_count - 1 else 0.0)
        backward[p.rank] += p.backward_s - (send_s if i > 0 else 0.0)
    return tuple(forward), tuple(backward)
