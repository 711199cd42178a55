"""The blocks split into contiguous stages by price."""

import math

from autoplan.pipeline_parallel.partition import split_blocks


def _priced(pre: float, block: float, post: float, stages: int):
    def seconds(stage: int, blocks: int) -> float:
        return blocks * block + (pre if stage == 0 else 0.0) + (post if stage == stages - 1 else 0.0)
    return seconds


def test_equal_blocks_split_evenly():
    assert split_blocks(8, 4, _priced(0.0, 1.0, 0.0, 4)) == (2, 2, 2, 2)


def test_a_heavy_head_takes_blocks_from_the_last_stage():
    # head = 3 blocks' price: the largest stage costs 4 (15 over 4 stages, rounded up to a
    # block), so the last stage holds at most one block; counting layers would give it 3 (cost 6)
    counts = split_blocks(12, 4, _priced(0.0, 1.0, 3.0, 4))
    assert counts is not None and sum(counts) == 12
    assert max(_priced(0.0, 1.0, 3.0, 4)(i, k) for i, k in enumerate(counts)) == 4.0
    assert counts[-1] <= 1


def test_first_and_last_stages_may_hold_only_the_embedding_and_head():
    counts = split_blocks(2, 4, _priced(5.0, 1.0, 5.0, 4))
    assert counts == (0, 1, 1, 0)


def test_too_few_blocks_or_nothing_that_fits():
    assert split_blocks(1, 4, _priced(0.0, 1.0, 0.0, 4)) is None
    assert split_blocks(4, 2, lambda stage, blocks: math.inf) is None


def test_an_unfittable_block_count_is_avoided():
    # stage 0 cannot hold more than one block (its memory): the rest go to stage 1
    def seconds(stage, blocks):
        return math.inf if stage == 0 and blocks > 1 else float(blocks)
    assert split_blocks(5, 2, seconds) == (1, 4)


def test_ends_without_modules_of_their_own_get_a_block():
    counts = split_blocks(3, 3, _priced(5.0, 1.0, 5.0, 3), empty_ends=(False, False))
    assert counts == (1, 1, 1)
    assert split_blocks(2, 3, _priced(0.0, 1.0, 0.0, 3), empty_ends=(False, True)) == (1, 1, 0)
    assert split_blocks(2, 3, _priced(0.0, 1.0, 0.0, 3), empty_ends=(False, False)) is None


def test_at_the_same_largest_price_the_split_of_least_total_is_kept():
    # the first stage's blocks cost more (its memory makes it checkpoint): filled from the
    # front it would hold as many as the limit allows; from the back it holds fewer, for less in all
    def seconds(stage, blocks):
        return blocks * (1.5 if stage == 0 else 1.0)
    counts = split_blocks(7, 3, seconds)
    assert max(seconds(i, k) for i, k in enumerate(counts)) == 3.0
    assert counts == (1, 3, 3)
