"""Least-squares fits that turn timings into profile figures.

Both models the cost stage uses are straight lines once written the right way round:

    collective:  t = latency + factor(n) * bytes / bus_bandwidth
                 x = factor(n) * bytes          ->  t = a + b x,  a = latency,  b = 1 / bus_bandwidth

    compute:     t = overhead + amount / (peak * eff(amount)),  eff(x) = max * x / (x + half_at)
                 => t - overhead = half_at / (peak * max) + x / (peak * max)
                 ->  t - overhead = a + b x,  max = 1 / (peak * b),  half_at = a / b

(the second is ``cost._work`` plus the per-op overhead, for a compute-bound or a memory-bound op, so a
fitted curve reproduces the measured times through the same code that plans with it).

Timings span five or more decades of size, so no fit may let the largest size decide alone
(an unweighted least-squares line does, and leaves the latency to chance, often negative).
Every fit minimises the error in *log* time, ``sum(log(model / t) ** 2)``: scale-free like a
relative error, but symmetric (see ``fit_line``). Both unknowns are kept non-negative: a
negative latency or bandwidth has no meaning. The quality of a fit is reported as its
relative RMS error, ``sqrt(mean(((model - t) / t) ** 2))``, over the points it was fitted to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.cost.profile import Saturation

MIN_LATENCY_S = 1e-9
"""Latencies and overheads below a nanosecond are noise; profiles need them positive."""
MAX_BANDWIDTH = 1e18
"""Caps the bandwidth of a fit whose times do not grow with size (slope zero)."""
LAUNCH_BOUND_RATIO = 2.0
"""Compute timings under this many per-op overheads are left out of the efficiency fits."""
MIN_HALF_AT = 1.0
"""An efficiency curve with no measurable ramp: full efficiency from one flop or byte on."""


@dataclass(frozen=True, slots=True)
class LineFit:
    """``t = base + intercept + slope * x``, both non-negative, fitted in log error (``fit_line``)."""

    intercept: float
    """Seconds at x = 0."""
    slope: float
    """Seconds per unit of x."""
    rel_rms: float
    """Root mean square of (model - measured) / measured over the fitted points."""


@dataclass(frozen=True, slots=True)
class AlphaBetaFit:
    """A collective's cost: ``t = latency + factor(n) * bytes / bus_bandwidth``."""

    latency_s: float
    """Fixed time of one call, as seen through PyTorch."""
    bus_bandwidth_bytes_per_s: float
    """nccl-tests bus bandwidth."""
    rel_rms: float
    """Relative RMS error of the fit over its samples."""
    samples: int
    """How many timings it was fitted to."""

    def to_dict(self) -> dict:
        return {
            "latency_s": _round(self.latency_s),
            "bus_bandwidth_bytes_per_s": _round(self.bus_bandwidth_bytes_per_s),
        }


@dataclass(frozen=True, slots=True)
class SaturationFit:
    """A compute efficiency curve, with its fit quality."""

    curve: Saturation
    """``max * x / (x + half_at)``: the fraction of the peak reached at work size x."""
    rel_rms: float
    """Relative RMS error of the predicted times over the samples."""
    samples: int
    """How many timings it was fitted to (launch-bound ones are left out)."""


def fit_line(x: Sequence[float], seconds: Sequence[float], base: Sequence[float] | None = None) -> LineFit:
    """Non-negative ``a, b`` that make ``base + a + b x`` match ``seconds`` in log error.

    ``base`` (default zero) is a known part of each time, such as the per-op overhead.
    A relative-error least-squares line (closed form) is the start; Gauss-Newton on
    ``sum(log(model / t) ** 2)`` then refines it. The log error is symmetric: a model 2x too
    slow costs as much as one 2x too fast, where relative error would cap the second at 100 %
    and so favour underestimates. With multiplicative timing noise it is also the maximum
    likelihood fit.
    """
    offset = [0.0] * len(x) if base is None else list(base)
    if not (len(x) == len(seconds) == len(offset)) or not x:
        raise ValueError(f"expected as many sizes as timings (at least one), got {len(x)} and {len(seconds)}")
    if any(not (t > 0 and math.isfinite(t)) for t in seconds):
        raise ValueError(f"expected positive finite timings, got {list(seconds)}")
    # Scaled to order one, so that FLOP counts of 1e13 and times of 1e-6 s condition well.
    x_scale, t_scale = max(max(x), 1e-300), max(seconds)
    xs = [xi / x_scale for xi in x]
    ts = [t / t_scale for t in seconds]
    bs = [o / t_scale for o in offset]
    a, b = _relative_line(xs, [t - o for t, o in zip(ts, bs)], ts)
    a, b = _refine_log(xs, ts, bs, a, b)
    a, b = a * t_scale, b * t_scale / x_scale
    return LineFit(a, b, _rms([(o + a + b * xi - t) / t for xi, t, o in zip(x, seconds, offset)]))


def _relative_line(x: list[float], y: list[float], r: list[float]) -> tuple[float, float]:
    """Closed-form non-negative ``y = a + b x`` minimising ``sum(((a + b x - y) / r) ** 2)``."""
    weights = [1.0 / (v * v) for v in r]
    s = sum(weights)
    sx = sum(w * xi for w, xi in zip(weights, x))
    sxx = sum(w * xi * xi for w, xi in zip(weights, x))
    sy = sum(w * yi for w, yi in zip(weights, y))
    sxy = sum(w * xi * yi for w, xi, yi in zip(weights, x, y))
    det = s * sxx - sx * sx
    if det > 1e-12 * s * sxx:  # at least two distinct sizes
        a = (sxx * sy - sx * sxy) / det
        b = (s * sxy - sx * sy) / det
        if a >= 0 and b >= 0:
            return a, b
    # The optimum leaves the feasible quadrant, so the constrained one lies on an edge:
    # try both (each clamped at zero) and keep the better.
    edges = [(max(sy / s, 0.0), 0.0)]
    if sxx > 0:
        edges.append((0.0, max(sxy / sxx, 0.0)))
    return min(edges, key=lambda ab: sum(w * (ab[0] + ab[1] * xi - yi) ** 2 for w, xi, yi in zip(weights, x, y)))


def _refine_log(x: list[float], t: list[float], base: list[float], a: float, b: float) -> tuple[float, float]:
    """Projected Gauss-Newton on ``sum(log((base + a + b x) / t) ** 2)``, a and b kept >= 0."""
    if min(o + a + b * xi for xi, o in zip(x, base)) <= 0:
        a = min(t)  # a start where every model time is positive

    def cost(a_, b_):
        return sum((math.log(o + a_ + b_ * xi) - math.log(ti)) ** 2 for xi, ti, o in zip(x, t, base))

    current = cost(a, b)
    for _ in range(_GN_STEPS):
        model = [o + a + b * xi for xi, o in zip(x, base)]
        residual = [math.log(m) - math.log(ti) for m, ti in zip(model, t)]
        ja = [1.0 / m for m in model]
        jb = [xi / m for xi, m in zip(x, model)]
        free = [not (a <= 0 and sum(g * r for g, r in zip(ja, residual)) > 0),
                not (b <= 0 and sum(g * r for g, r in zip(jb, residual)) > 0)]
        da, db = _gauss_newton_step(ja if free[0] else None, jb if free[1] else None, residual)
        step = 1.0
        while step > 1e-6:
            na, nb = max(a + step * da, 0.0), max(b + step * db, 0.0)
            if min(o + na + nb * xi for xi, o in zip(x, base)) > 0 and cost(na, nb) < current:
                break
            step /= 2
        else:
            break  # no step improves: converged
        improvement = current - cost(na, nb)
        a, b, current = na, nb, cost(na, nb)
        if improvement < 1e-15 * max(current, 1e-300):
            break
    return a, b


def _gauss_newton_step(ja: list[float] | None, jb: list[float] | None, r: list[float]) -> tuple[float, float]:
    """Solve the 2x2 (or 1x1, when a variable is held at zero) normal equations."""
    if ja is not None and jb is not None:
        saa = sum(g * g for g in ja)
        sab = sum(g * h for g, h in zip(ja, jb))
        sbb = sum(h * h for h in jb)
        ga = sum(g * v for g, v in zip(ja, r))
        gb = sum(h * v for h, v in zip(jb, r))
        det = saa * sbb - sab * sab
        if det > 1e-14 * saa * sbb:
            return (-(sbb * ga - sab * gb) / det, -(saa * gb - sab * ga) / det)
        jb = None  # degenerate (one distinct size): move the intercept alone
    if ja is not None:
        return -sum(g * v for g, v in zip(ja, r)) / sum(g * g for g in ja), 0.0
    if jb is not None:
        return 0.0, -sum(h * v for h, v in zip(jb, r)) / sum(h * h for h in jb)
    return 0.0, 0.0


def fit_alpha_beta(nbytes: Sequence[float], factors: Sequence[float], seconds: Sequence[float]) -> AlphaBetaFit:
    """Latency and bus bandwidth of one collective from timings at several sizes.

    ``factors`` are the nccl-tests bus factors of each sample's group size (samples from
    groups of different sizes may be pooled: the factor puts them on one line).
    """
    x = [f * b for f, b in zip(factors, nbytes)]
    line = fit_line(x, seconds)
    latency = max(line.intercept, MIN_LATENCY_S)
    bandwidth = min(1.0 / line.slope, MAX_BANDWIDTH) if line.slope > 0 else MAX_BANDWIDTH
    return AlphaBetaFit(latency, bandwidth, _rel_rms(latency, 1.0 / bandwidth, x, seconds), len(x))


def fit_saturation(
    amounts: Sequence[float], seconds: Sequence[float], peaks: Sequence[float], overhead_s: float
) -> SaturationFit:
    """The efficiency curve that makes ``overhead + x / (peak * eff(x))`` match the timings.

    ``amounts`` are FLOPs (matmul) or bytes moved (memory-bound ops); ``peaks[i]`` is the
    throughput sample i's efficiency is relative to (one per sample, so that matmuls of
    several dtypes, each with its own peak, share one curve as the profile has one);
    ``overhead_s`` is the per-op time the cost stage adds on top (``kernel_overhead_s``),
    a known part of every timing. Scaled by its peak, each sample lies on the line
    ``(t - overhead) * peak = half_at / max + x / max``.
    """
    if len(peaks) != len(amounts) or any(p <= 0 for p in peaks):
        raise ValueError(f"expected one positive peak per sample, got {list(peaks)}")
    # Ops that take about the overhead are launch-bound: they say nothing about throughput
    # (on a GPU the device finishes them before the next launch), and fitting the additive
    # model to them would bend the curve away from the large ops that dominate a step.
    bound = [i for i, t in enumerate(seconds) if t >= LAUNCH_BOUND_RATIO * overhead_s]
    if len(bound) >= 2:
        amounts, seconds, peaks = ([v[i] for i in bound] for v in (amounts, seconds, peaks))
    # The error is that of the whole time, overhead included: a small op whose time is
    # mostly overhead must not weigh more because little is left once that is taken off.
    line = fit_line(amounts, [t * p for t, p in zip(seconds, peaks)], [overhead_s * p for p in peaks])
    slope = line.slope if line.slope > 0 else 1e-3  # no growth with size: call it 1000x the peak
    curve = Saturation(max=1.0 / slope, half_at=max(line.intercept / slope, MIN_HALF_AT))
    predicted = [overhead_s + x / (p * curve.at(x)) for x, p in zip(amounts, peaks)]
    return SaturationFit(curve, _rms([(m - t) / t for m, t in zip(predicted, seconds)]), len(amounts))


def _rel_rms(a: float, b: float, x: Sequence[float], seconds: Sequence[float]) -> float:
    return _rms([(a + b * xi - t) / t for xi, t in zip(x, seconds)])


_GN_STEPS = 100


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def _round(value: float) -> float:
    """Four significant digits: more would only record measurement noise."""
    return float(f"{value:.4g}")
