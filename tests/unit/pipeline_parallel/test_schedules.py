"""Schedules priced against the textbook formulas, worked by hand."""

import pytest

from autoplan.pipeline_parallel.schedules import ScheduleShape, candidate_shapes, in_flight, makespan


def test_gpipe_and_1f1b_with_equal_stages_take_m_plus_p_minus_1_slots():
    # p = 4 ranks, m = 8 microbatches, F = 1, B = 2: (m + p - 1) (F + B) = 11 * 3 = 33
    for name in ("GPipe", "1F1B"):
        span = makespan(ScheduleShape(name), (1.0,) * 4, (2.0,) * 4, 8)
        assert span.seconds == pytest.approx(33.0)
        assert span.bubble_share == pytest.approx(3 / 11)  # (p - 1) / (m + p - 1)


def test_interleaving_divides_the_bubble_by_the_stages_per_rank():
    # (m + (p - 1) / v) (F + B) = (8 + 3 / 2) * 3 = 28.5
    span = makespan(ScheduleShape("Interleaved1F1B", 2), (1.0,) * 4, (2.0,) * 4, 8)
    assert span.seconds == pytest.approx(28.5)
    assert span.bubble_share == pytest.approx(1 - 24 / 28.5)


def test_unequal_stages_run_at_the_pace_of_the_busiest():
    # busiest L = 4 (rank 2); fill and drain: the others' loads 3 + 3 + 3 = 9: 8 * 4 + 9 = 41
    span = makespan(ScheduleShape("1F1B"), (1.0, 1.0, 1.0, 1.0), (2.0, 2.0, 3.0, 2.0), 8)
    assert span.seconds == pytest.approx(41.0)


def test_zero_bubble_schedules_fill_the_bubble_with_weight_gradients():
    # F = 1, B = 2 (W = 1): ZB-H1's bubble per stage F + B - W = 2 of 3; ZB-V's F + B - 2W = 1 of 3
    h1 = makespan(ScheduleShape("InterleavedZeroBubble", 2), (1.0,) * 4, (2.0,) * 4, 8)
    assert h1.seconds == pytest.approx(8 * 3 + (2 / 3) * 9 / 2)
    v = makespan(ScheduleShape("ZBVZeroBubble", 2), (1.0,) * 4, (2.0,) * 4, 8)
    assert v.seconds == pytest.approx(8 * 3 + (1 / 3) * 9 / 2)
    assert v.seconds < h1.seconds < makespan(ScheduleShape("Interleaved1F1B", 2), (1.0,) * 4, (2.0,) * 4, 8).seconds


def test_microbatches_in_flight_at_each_ranks_peak():
    assert [in_flight(ScheduleShape("GPipe"), 4, 8, r) for r in range(4)] == [8, 8, 8, 8]
    assert [in_flight(ScheduleShape("1F1B"), 4, 8, r) for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight(ScheduleShape("1F1B"), 4, 2, r) for r in range(4)] == [2, 2, 2, 1]
    # interleaved, v = 2, p = 4, m = 8: warm-up (v - 1) p + 2 (p - 1 - r) stages, one more held, over v
    assert [in_flight(ScheduleShape("Interleaved1F1B", 2), 4, 8, r) for r in range(4)] == [5.5, 4.5, 3.5, 2.5]
    # zero bubble looped: one hop per rank instead of two
    assert [in_flight(ScheduleShape("InterleavedZeroBubble", 2), 4, 8, r) for r in range(4)] == [4, 3.5, 3, 2.5]
    # ZBV, p = 4, m = 8: 2p - 1 - r forwards of the first stage and p of the second, over 2
    assert [in_flight(ScheduleShape("ZBVZeroBubble", 2), 4, 8, r) for r in range(4)] == [5.5, 5, 4.5, 4]


def test_stage_ranks_loop_or_fold_into_a_v():
    assert ScheduleShape("Interleaved1F1B", 2).stage_ranks(3) == (0, 1, 2, 0, 1, 2)
    assert ScheduleShape("ZBVZeroBubble", 2).stage_ranks(3) == (0, 1, 2, 2, 1, 0)
    assert ScheduleShape("1F1B").stage_ranks(3) == (0, 1, 2)


def test_what_torch_schedules_accept():
    assert ScheduleShape("1F1B").allows(4, 4) and not ScheduleShape("1F1B").allows(4, 3)
    assert ScheduleShape("Interleaved1F1B", 2).allows(4, 8) and not ScheduleShape("Interleaved1F1B", 2).allows(4, 6)
    assert not ScheduleShape("ZBVZeroBubble", 3).allows(4, 8)
    assert ScheduleShape("ZBVZeroBubble", 2).allows(4, 7) and not ScheduleShape("ZBVZeroBubble", 2).allows(4, 6)
    names = {(s.name, s.virtual) for s in candidate_shapes(3)}
    assert names == {("GPipe", 1), ("1F1B", 1), ("ZBVZeroBubble", 2), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3),
                     ("InterleavedZeroBubble", 2), ("InterleavedZeroBubble", 3)}
