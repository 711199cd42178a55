"""Must-show 1 (fit): the calibration fits recover known figures from synthetic timings.

Timings are generated from the very models the cost stage uses (``comm.collective_seconds``
and the roofline's Saturation curve), exactly and with multiplicative noise, over the
size ranges a real sweep covers.
"""

import math
import random

import pytest

from autoplan.calibrate.fit import fit_alpha_beta, fit_line, fit_saturation
from autoplan.calibrate.sizes import sweep_for
from autoplan.cost.comm import bus_factor

LATENCY, BANDWIDTH = 25e-6, 40e9
SIZES = sweep_for("cuda", quick=False).message_bytes  # 4 KiB .. 256 MiB


def collective_times(kind, n, sizes, noise=0.0, seed=0, latency=LATENCY, bandwidth=BANDWIDTH):
    rng = random.Random(seed)
    return [(latency + bus_factor(kind, n) * b / bandwidth) * math.exp(rng.gauss(0, noise)) for b in sizes]


@pytest.mark.parametrize("kind,n", [("all_reduce", 8), ("all_gather", 4), ("reduce_scatter", 2), ("all_to_all", 8)])
def test_exact_timings_give_back_latency_and_bandwidth(kind, n):
    times = collective_times(kind, n, SIZES)
    fit = fit_alpha_beta(SIZES, [bus_factor(kind, n)] * len(SIZES), times)
    assert fit.latency_s == pytest.approx(LATENCY, rel=1e-6)
    assert fit.bus_bandwidth_bytes_per_s == pytest.approx(BANDWIDTH, rel=1e-6)
    assert fit.rel_rms < 1e-9
    assert fit.samples == len(SIZES)


def test_noisy_timings_stay_close():
    """5 % log-normal noise, three repeats per size: within 10 % of both figures."""
    sizes = [b for b in SIZES for _ in range(3)]
    times = collective_times("all_reduce", 8, sizes, noise=0.05, seed=1)
    fit = fit_alpha_beta(sizes, [bus_factor("all_reduce", 8)] * len(sizes), times)
    assert fit.latency_s == pytest.approx(LATENCY, rel=0.1)
    assert fit.bus_bandwidth_bytes_per_s == pytest.approx(BANDWIDTH, rel=0.1)
    assert 0.02 < fit.rel_rms < 0.1  # the residual reports the noise


def test_groups_of_different_sizes_pool_onto_one_line():
    """Bus factors put a 2-rank and an 8-rank axis of the same link on one line."""
    times = collective_times("all_gather", 2, SIZES) + collective_times("all_gather", 8, SIZES)
    factors = [bus_factor("all_gather", 2)] * len(SIZES) + [bus_factor("all_gather", 8)] * len(SIZES)
    fit = fit_alpha_beta(list(SIZES) * 2, factors, times)
    assert fit.latency_s == pytest.approx(LATENCY, rel=1e-6)
    assert fit.bus_bandwidth_bytes_per_s == pytest.approx(BANDWIDTH, rel=1e-6)


def test_relative_error_keeps_small_message_latency():
    """An unweighted fit would let 256 MiB decide alone; a 1 % error there dwarfs the latency."""
    times = collective_times("all_reduce", 8, SIZES)
    times[-1] *= 1.01
    fit = fit_alpha_beta(SIZES, [bus_factor("all_reduce", 8)] * len(SIZES), times)
    assert fit.latency_s == pytest.approx(LATENCY, rel=0.05)


def test_fit_never_returns_a_negative_latency_or_bandwidth():
    # Times that fall with size: the best non-negative line is flat (bandwidth capped).
    flat = fit_alpha_beta([1e3, 1e6, 1e9], [1.0, 1.0, 1.0], [3e-3, 2e-3, 1e-3])
    assert flat.latency_s > 0 and flat.bus_bandwidth_bytes_per_s > 0
    # Pure bandwidth, no latency: the latency is floored at a positive value.
    line = fit_line([1.0, 2.0, 4.0], [2.0, 4.0, 8.0])
    assert line.intercept == 0.0 and line.slope == pytest.approx(2.0)
    bandwidth_only = fit_alpha_beta([1e6, 2e6], [1.0, 1.0], [1e-3, 2e-3])
    assert 0 < bandwidth_only.latency_s <= 1e-9
    assert bandwidth_only.bus_bandwidth_bytes_per_s == pytest.approx(1e9)


def test_fit_rejects_mismatched_or_nonpositive_input():
    with pytest.raises(ValueError, match="as many sizes as timings"):
        fit_line([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive finite timings"):
        fit_line([1.0, 2.0], [1.0, 0.0])


PEAK, MAX, HALF_AT, OVERHEAD = 1e12, 0.8, 5e9, 4e-6
FLOPS = [2.0 * s**3 for s in (256, 512, 1024, 2048, 4096, 8192)]


def roofline_times(amounts, peak=PEAK, max_=MAX, half_at=HALF_AT, overhead=OVERHEAD, noise=0.0, seed=0):
    """What ``kernel_overhead_s + cost._work`` gives for a compute-bound op of ``amount`` FLOPs."""
    rng = random.Random(seed)
    return [(overhead + x / (peak * max_ * x / (x + half_at))) * math.exp(rng.gauss(0, noise)) for x in amounts]


def test_saturation_fit_recovers_max_and_half_at():
    fit = fit_saturation(FLOPS, roofline_times(FLOPS), [PEAK] * len(FLOPS), OVERHEAD)
    assert fit.curve.max == pytest.approx(MAX, rel=1e-6)
    assert fit.curve.half_at == pytest.approx(HALF_AT, rel=1e-6)
    assert fit.rel_rms < 1e-9


def test_saturation_fit_with_noise():
    amounts = [x for x in FLOPS for _ in range(3)]
    times = roofline_times(amounts, noise=0.03, seed=2)
    fit = fit_saturation(amounts, times, [PEAK] * len(amounts), OVERHEAD)
    assert fit.curve.max == pytest.approx(MAX, rel=0.1)
    assert fit.curve.half_at == pytest.approx(HALF_AT, rel=0.2)


def test_saturation_fit_shares_one_curve_across_dtypes():
    """bf16 and fp32 samples, each relative to its own peak, give back the one curve."""
    bf16 = roofline_times(FLOPS, peak=1e15)
    fp32 = roofline_times(FLOPS, peak=6e13)
    fit = fit_saturation(FLOPS * 2, bf16 + fp32, [1e15] * len(FLOPS) + [6e13] * len(FLOPS), OVERHEAD)
    assert fit.curve.max == pytest.approx(MAX, rel=1e-6)
    assert fit.curve.half_at == pytest.approx(HALF_AT, rel=1e-6)


def test_saturation_fit_with_the_best_measured_point_as_peak():
    """The profile's peak is the best measured throughput; the curve then reproduces the times."""
    times = roofline_times(FLOPS)
    best = max(x / t for x, t in zip(FLOPS, times))
    fit = fit_saturation(FLOPS, times, [best] * len(FLOPS), OVERHEAD)
    predicted = [OVERHEAD + x / (best * fit.curve.at(x)) for x in FLOPS]
    assert predicted == pytest.approx(times, rel=1e-6)
    assert fit.curve.max >= 1.0  # the asymptote lies beyond the best measured point


def test_launch_bound_timings_do_not_bend_the_curve():
    """GPU ops shorter than a launch all take about the launch time; they are left out."""
    small = [1e3 * 2**i for i in range(8)]
    times = roofline_times(FLOPS) + [OVERHEAD * 1.2] * len(small)
    fit = fit_saturation(FLOPS + small, times, [PEAK] * (len(FLOPS) + len(small)), OVERHEAD)
    assert fit.samples == len(FLOPS)
    assert fit.curve.max == pytest.approx(MAX, rel=1e-6)
    assert fit.curve.half_at == pytest.approx(HALF_AT, rel=1e-6)


def synthetic_measurements(optimizer_param_s=2e-3, optimizer_bytes_per_s=1.5e9):
    """A 2x4 run's measurements, generated from known figures."""
    from autoplan.calibrate.dispatch import DispatchSample, OptimizerSample
    from autoplan.calibrate.dispatch_classes import OpClassSample
    from autoplan.calibrate.sweep import CollectiveSample, MatmulSample, Measurements, MemorySample

    sweep = sweep_for("cpu", quick=False)
    collectives = tuple(
        CollectiveSample(axis, kind, n, b, t)
        for axis, n in enumerate((2, 4)) for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
        for b, t in zip(sweep.message_bytes, collective_times(kind, n, sweep.message_bytes))
    )
    shapes = sweep.matmul_shapes
    matmuls = tuple(MatmulSample("float32", s, 2.0 * math.prod(s), t)
                    for s, t in zip(shapes, roofline_times([2.0 * math.prod(s) for s in shapes])))
    memory = tuple(MemorySample("add", e, 12 * e, 4e-6 + 12 * e / 1e10) for e in sweep.memory_elements)
    optimizer = tuple(OptimizerSample(e, 4 * e, optimizer_param_s + 4 * e / optimizer_bytes_per_s) for e in sweep.optimizer_elements)
    op_classes = (
        OpClassSample("view", "aten.view.default", 1e-4, 2e-4),
        OpClassSample("view", "aten.t.default", 5e-5, 1e-4),
        OpClassSample("matmul", "aten.mm.default", 2e-4, 8e-4),
    )
    return Measurements(collectives, matmuls, memory, OVERHEAD, DispatchSample(1.9e-4, 6e-4, optimizer, op_classes))


def test_built_profile_loads_and_carries_the_dispatch_fits():
    from autoplan.calibrate.host import ClusterInfo
    from autoplan.calibrate.profile_writer import RunInfo, build_profile
    from autoplan.cost.profile import profile_from_dict

    run = RunInfo("synthetic", (2, 4), ("dp", "tp"), "gloo", "cpu", sweep_for("cpu", quick=False), False, 1, 60.0, {})
    cluster = ClusterInfo(("abc",), 8, "CPU: test", 2**30, ("CPU: test",))
    data = build_profile(run, synthetic_measurements(), cluster)
    profile = profile_from_dict(data)
    assert profile.dispatch.forward_op_s == pytest.approx(1.9e-4)
    assert profile.dispatch.backward_op_s == pytest.approx(6e-4)
    assert profile.dispatch.optimizer_param_s == pytest.approx(2e-3, rel=1e-3)
    assert profile.dispatch.optimizer_bytes_per_s == pytest.approx(1.5e9, rel=1e-3)
    assert profile.dispatch.overlaps_device is False
    assert data["provenance"]["fits"]["optimizer"]["samples"] == len(sweep_for("cpu", quick=False).optimizer_elements)
    assert data["provenance"]["measurements"]["dtensor_backward_op_s"] == pytest.approx(6e-4)


def test_built_profile_prices_each_measured_op_class_by_the_mean_of_its_ops():
    from autoplan.calibrate.host import ClusterInfo
    from autoplan.calibrate.profile_writer import RunInfo, build_profile
    from autoplan.cost.profile import profile_from_dict

    run = RunInfo("synthetic", (2, 4), ("dp", "tp"), "gloo", "cpu", sweep_for("cpu", quick=False), False, 1, 60.0, {})
    cluster = ClusterInfo(("abc",), 8, "CPU: test", 2**30, ("CPU: test",))
    data = build_profile(run, synthetic_measurements(), cluster)
    dispatch = profile_from_dict(data).dispatch
    assert set(dispatch.op_classes) == {"view", "matmul"}
    assert dispatch.fixed_seconds("view") == pytest.approx((7.5e-5, 1.5e-4))
    assert dispatch.fixed_seconds("matmul") == pytest.approx((2e-4, 8e-4))
    assert dispatch.fixed_seconds("norm") == pytest.approx((1.9e-4, 6e-4))  # not measured: the generic chain's
    assert data["provenance"]["measurements"]["dtensor_op_classes"] == [
        ["view", "aten.view.default", 1e-4, 2e-4], ["view", "aten.t.default", 5e-5, 1e-4], ["matmul", "aten.mm.default", 2e-4, 8e-4],
    ]
