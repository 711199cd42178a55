"""Candidates priced on a layout given by hand: times per stage, memory in flight, checkpointing."""

import pytest

from autoplan.pipeline_parallel.parts import LayoutParts, PartCost
from autoplan.pipeline_parallel.schedules import ScheduleShape
from autoplan.pipeline_parallel.search import FixedStages, PricingInputs, best_option, microbatch_counts, price_option

GB = 1e9


def _parts() -> LayoutParts:
    # at the traced batch of 8 sequences: a block runs 8 s forward, 16 s backward per 8 sequences
    block = PartCost(forward_per_token=8.0, backward_per_token=16.0, per_step=0.5, state_bytes=1 * GB,
                     activation_bytes=8 * GB, full_rerun=8.0, full_freed=8 * GB, selective_rerun=2.0,
                     selective_freed=4 * GB)
    pre = PartCost(forward_per_token=1.0, backward_per_token=1.0, state_bytes=2 * GB, per_step=0.25)
    post = PartCost(forward_per_token=4.0, backward_per_token=4.0, state_bytes=2 * GB, per_step=0.25)
    return LayoutParts(pre, block, post, blocks=4, boundary_bytes=0.8 * GB, traced_sequences=8)


def _inputs(budget: float) -> PricingInputs:
    return PricingInputs(sequences=8, dp=1, budget_bytes=budget, send_latency_s=0.0, send_bytes_per_s=1 * GB)


def test_1f1b_on_two_ranks_by_hand():
    option = price_option(_parts(), _inputs(1e15), 2, ScheduleShape("1F1B"), 4)
    assert option is not None and option.fits
    # 4 microbatches of 2 sequences: a block is 2 s forward, 4 s backward; the embedding 0.25 + 0.25,
    # the head 1 + 1; the send of 0.2 GB at 1 GB/s 0.2 s each way; split by price 2 + 2 blocks
    first, last = option.stages
    assert (first.blocks, last.blocks) == (2, 2)
    assert first.forward_s == pytest.approx(0.25 + 4 + 0.2) and first.backward_s == pytest.approx(0.25 + 8)
    assert last.forward_s == pytest.approx(1 + 4) and last.backward_s == pytest.approx(1 + 8 + 0.2)
    # makespan: 4 x the busiest rank's 14.2 + the other rank's 12.7; then a rank's per-step 0.25 + 2 x 0.5
    assert option.makespan_s == pytest.approx(4 * 14.2 + 12.7)
    assert option.step_s == pytest.approx(option.makespan_s + 1.25)
    assert option.p2p_s == pytest.approx(option.makespan_s - (4 * 14.0 + 12.5))
    assert option.bubble_share == pytest.approx(1 - 4 * (14.2 + 12.7) / 2 / option.makespan_s)
    # in flight: rank 0 holds min(4, 2) microbatches, rank 1 one; a microbatch's blocks keep 2 GB each
    assert first.peak_bytes == pytest.approx((2 + 2) * GB + 2 * 2 * 2 * GB)
    assert last.peak_bytes == pytest.approx((2 + 2) * GB + 1 * 2 * 2 * GB)


def test_gpipe_keeps_every_microbatch():
    option = price_option(_parts(), _inputs(1e15), 2, ScheduleShape("GPipe"), 4)
    assert option.stages[1].peak_bytes == pytest.approx(4 * GB + 4 * 2 * 2 * GB)


def test_the_fewest_blocks_are_checkpointed_to_fit():
    # rank 0 needs 12 GB; at 10 GB it must free 2 GB: one block selective (2 held x 1 GB freed)
    option = price_option(_parts(), _inputs(10 * GB), 2, ScheduleShape("1F1B"), 4)
    assert option.fits
    first = option.stages[0]
    assert (first.recompute, first.recomputed_blocks) == ("selective", 1)
    assert first.peak_bytes <= 10 * GB
    assert first.backward_s == pytest.approx(0.25 + 8 + 0.5)  # the rerun: 2 s per 8 sequences, a quarter of it


def test_nothing_fits_is_said_and_the_closest_kept():
    best = best_option(_parts(), _inputs(1 * GB), 2)
    assert best is not None and not best.fits


def test_microbatch_counts_divide_the_batch_per_data_parallel_rank():
    assert microbatch_counts(64, 4, 2) == (2, 4, 8, 16)
    assert microbatch_counts(64, 3, 2) == ()


def test_a_recipes_checkpointing_and_gradient_accumulation():
    # one rank, 4 microbatches accumulated, every block fully checkpointed: the rerun is a
    # block's forward, and a microbatch keeps nothing of the blocks (the budget is not met: said)
    option = price_option(_parts(), _inputs(4 * GB), 1, ScheduleShape("1F1B"), 4, checkpoint="full")
    (stage,) = option.stages
    assert (stage.recompute, stage.recomputed_blocks, stage.blocks) == ("full", 4, 4)
    assert stage.backward_s == pytest.approx(0.25 + 4 * 4 + 1 + 4 * 2)
    assert stage.peak_bytes == pytest.approx(8 * GB) and not option.fits
    assert option.makespan_s == pytest.approx(4 * (stage.forward_s + stage.backward_s))


def test_a_fixed_split_and_checkpointing_are_priced_as_given():
    # the split by price is 2 + 2 (above); given 3 + 1 with one block of the first stage
    # selective, that is what is priced, whatever the budget would have chosen
    fixed = FixedStages((3, 1), (("selective", 1), (None, 0)))
    option = price_option(_parts(), _inputs(1e15), 2, ScheduleShape("1F1B"), 4, fixed=fixed)
    first, last = option.stages
    assert (first.blocks, last.blocks) == (3, 1)
    assert (first.recompute, first.recomputed_blocks, last.recompute) == ("selective", 1, None)
    assert first.backward_s == pytest.approx(0.25 + 12 + 0.5)  # one block's rerun: 2 s per 8 sequences, a quarter
    # rank 0 holds 2 microbatches of 3 blocks (2 GB each) and the embedding's state; the selective block frees 1 GB each
    assert first.peak_bytes == pytest.approx((2 + 3) * GB + 2 * 3 * 2 * GB - 2 * 1 * GB)
    # the same split as the search's, no checkpointing: the search's price
    free = price_option(_parts(), _inputs(1e15), 2, ScheduleShape("1F1B"), 4)
    same = price_option(_parts(), _inputs(1e15), 2, ScheduleShape("1F1B"), 4,
                        fixed=FixedStages((2, 2), ((None, 0), (None, 0))))
    assert same == free
    # a split that does not hold every block once prices nothing
    assert price_option(_parts(), _inputs(1e15), 2, ScheduleShape("1F1B"), 4, fixed=FixedStages((2, 1), ((None, 0),) * 2)) is None
