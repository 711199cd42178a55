"""Turn one run's measurements into a cluster profile (the JSON that ``load_profile`` reads).

What goes where:

- ``axes[mesh]``: per mesh axis and collective, latency and bus bandwidth fitted to that
  axis's timings alone; used when planning on the calibrated mesh shape.
- ``links``: per link class (intra-node, inter-node), one fit pooled over the axes whose
  groups use that link (bus factors put groups of different sizes on one line), so other
  mesh shapes on the same cluster are priced from measurements too. A class no axis used
  (a single-host run has no inter-node axis) copies the other class and says so. A
  one-device run (``--mesh 1 --links-from PROFILE``) measures no collective: it copies
  every link class, and the devices per node, from that profile (``LinksSource``).
- ``device.peak_flops`` per dtype and ``memory_bandwidth_bytes_per_s``: the best throughput
  measured in the sweep, not a datasheet figure. A CPU has no meaningful datasheet peak
  for eight processes sharing two cores, and a measured best keeps a GPU profile honest
  about what PyTorch reaches; the efficiency curves are relative to these peaks (their
  ``max`` can exceed 1 slightly, where the fitted asymptote lies beyond the best point;
  above the schema's bound of 1.5 the excess is folded into the peak, which predicts the same).
- ``efficiency``: the Saturation curves fitted by ``fit.fit_saturation`` and the per-op
  overhead (a one-element add), which together reproduce the measured times through the
  cost stage's roofline.
- ``dispatch``: the fixed costs of eager DTensor execution measured on the mesh
  (``dispatch.py``): per forward op, per forward op's backward, and ``AdamW.step()``'s
  time per parameter and bytes per second (a line fitted over parameter sizes); and
  ``op_classes``, per op class the mean forward and backward of its representative ops
  (``dispatch_classes.py``).
- ``provenance``: how, when and on what it was measured, the sweep, every fit's relative
  RMS error and the raw timings (so a profile can be refitted without rerunning).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

from autoplan.calibrate.dispatch_classes import class_figures
from autoplan.calibrate.fit import AlphaBetaFit, LineFit, SaturationFit, fit_alpha_beta, fit_line, fit_saturation
from autoplan.calibrate.host import ClusterInfo
from autoplan.calibrate.sizes import Sweep
from autoplan.calibrate.sweep import CollectiveSample, Measurements
from autoplan.cost.comm import axis_link, bus_factor
from autoplan.cost.profile import COLLECTIVES, LINKS, SCHEMA_VERSION, ClusterProfile, mesh_key

METHOD = (
    "autoplan calibrate: collectives through DTensor redistribute on each mesh axis (all groups at once), "
    "torch.mm and elementwise add/clone on every rank at once; DTensor op chains (forward, forward + backward), "
    "representative DTensor ops of each op class (forward, forward + backward) "
    "and AdamW steps over DTensor parameters on the mesh; median over repeats of the slowest rank; "
    "least-squares fits in log time (fit quality reported as relative RMS error)"
)


@dataclass(frozen=True, slots=True)
class LinksSource:
    """The profile a one-device run takes its links and node size from."""

    name: str
    links: dict
    """Link class -> collective -> {"latency_s", "bus_bandwidth_bytes_per_s"}, as in a profile."""
    devices_per_node: int
    measured: bool
    """Whether that profile's links were measured (a calibration) or are published figures."""

    @classmethod
    def of(cls, profile: ClusterProfile) -> LinksSource:
        links = {
            link: {
                kind: {"latency_s": cost.latency_s, "bus_bandwidth_bytes_per_s": cost.bus_bandwidth_bytes_per_s}
                for kind, cost in table.items()
            }
            for link, table in profile.links.items()
        }
        return cls(profile.name, links, profile.devices_per_node, bool(profile.provenance.get("measured")))


@dataclass(frozen=True, slots=True)
class RunInfo:
    """How the run was set up."""

    name: str
    """Profile name (the --out file's stem)."""
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    backend: str
    """"gloo" or "nccl"."""
    device_type: str
    """"cpu" or "cuda"."""
    sweep: Sweep
    quick: bool
    threads_per_rank: int
    """torch's intra-op threads in each rank (CPU timings depend on it)."""
    wall_time_s: float
    """From process-group start to the end of the sweep."""
    versions: dict
    """torch / CUDA / NCCL / Python versions (``host.versions``)."""
    links_from: LinksSource | None = None
    """A one-device run's source of links (None: the links were measured)."""


@dataclass(frozen=True)
class Fits:
    """Every fitted figure of one run."""

    axes: tuple[dict[str, AlphaBetaFit], ...]
    """Per mesh axis, collective -> fit; empty for one-device axes."""
    links: dict[str, dict[str, AlphaBetaFit]]
    """Link class -> collective -> fit; empty for a one-device run."""
    link_sources: dict[str, str]
    """Link class -> which axes it was fitted to, or where it was copied from; empty for a one-device run."""
    peak_flops: dict[str, float]
    """Best measured FLOP/s per dtype."""
    matmul: SaturationFit
    memory_bandwidth: float
    """Best measured bytes/s of the memory-bound ops."""
    memory: SaturationFit
    overhead_s: float
    optimizer: LineFit
    """AdamW step time per parameter against its local bytes: intercept s, slope s/byte."""


MAX_EFFICIENCY = 1.5
"""The profile schema's bound on an efficiency curve's ``max`` (a fraction of the peak)."""


def _within_bound(peaks, curve):
    """Peaks and curve with ``max`` folded into the peaks where the fit put it above the
    schema's bound (a sweep that never nears saturation): peak * efficiency is unchanged."""
    if curve.max <= MAX_EFFICIENCY:
        return peaks, curve
    scaled = {k: v * curve.max for k, v in peaks.items()} if isinstance(peaks, dict) else tuple(v * curve.max for v in peaks)
    return scaled, type(curve)(max=1.0, half_at=curve.half_at)


def fit_all(measured: Measurements, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...], devices_per_node: int) -> Fits:
    axes = tuple(
        {kind: _fit_collective([s for s in measured.collectives if s.axis == axis and s.kind == kind]) for kind in COLLECTIVES}
        if size > 1 else {}
        for axis, size in enumerate(mesh_shape)
    )
    links, sources = {}, {}
    for link in LINKS:
        on_link = [a for a, size in enumerate(mesh_shape) if size > 1 and axis_link(mesh_shape, a, devices_per_node) == link]
        if on_link:
            links[link] = {
                kind: _fit_collective([s for s in measured.collectives if s.axis in on_link and s.kind == kind])
                for kind in COLLECTIVES
            }
            sources[link] = "fitted to axes " + ", ".join(axis_names[a] for a in on_link)
    for link in LINKS if links else ():
        if link not in links:
            other = next(iter(links))
            links[link] = links[other]
            sources[link] = f"not measured (no axis of this mesh uses it): copied from {other}"

    peaks: dict[str, float] = {}
    for sample in measured.matmuls:
        peaks[sample.dtype] = max(peaks.get(sample.dtype, 0.0), sample.flops / sample.seconds)
    matmul = fit_saturation(
        [s.flops for s in measured.matmuls],
        [s.seconds for s in measured.matmuls],
        [peaks[s.dtype] for s in measured.matmuls],
        measured.overhead_s,
    )
    bandwidth = max(s.nbytes / s.seconds for s in measured.memory_ops)
    memory = fit_saturation(
        [s.nbytes for s in measured.memory_ops],
        [s.seconds for s in measured.memory_ops],
        [bandwidth] * len(measured.memory_ops),
        measured.overhead_s,
    )
    optimizer = fit_line([s.nbytes for s in measured.dispatch.optimizer], [s.seconds for s in measured.dispatch.optimizer])
    return Fits(axes, links, sources, peaks, matmul, bandwidth, memory, measured.overhead_s, optimizer)


def dispatch_section(measured: Measurements, fits: Fits, device_type: str) -> dict:
    """The profile's ``dispatch`` object (see ``profile.DispatchCost``)."""
    slope = fits.optimizer.slope
    section: dict[str, object] = {
        "forward_op_s": _sig(measured.dispatch.forward_op_s),
        "backward_op_s": _sig(measured.dispatch.backward_op_s),
        "optimizer_param_s": _sig(fits.optimizer.intercept),
        # A step whose time does not grow with size: no measurable bandwidth term.
        "optimizer_bytes_per_s": _sig(1.0 / slope) if slope > 0 else 1e18,
        "overlaps_device": device_type == "cuda",
    }
    classes = class_figures(measured.dispatch.op_classes)
    if classes:
        section["op_classes"] = {
            name: {"forward_op_s": _sig(forward), "backward_op_s": _sig(backward)}
            for name, (forward, backward) in classes.items()
        }
    if measured.compiled is not None:
        section["compiled"] = compiled_section(measured.compiled)
    return section


def compiled_section(sample) -> dict:
    """The profile's ``dispatch.compiled`` object (see ``profile.CompiledCost``): matmuls
    price every op that is not fused (their extern kernels' calls), multiplies the fused ones."""
    return {
        "forward_op_s": _sig(sample.matmul_forward_s),
        "backward_op_s": _sig(sample.matmul_backward_s),
        "graph_call_s": _sig(sample.graph_call_s),
        "fused_traffic": _sig(sample.fused_traffic),
        "measured": True,
        "op_classes": {
            "elementwise": {"forward_op_s": _sig(sample.elementwise_forward_s), "backward_op_s": _sig(sample.elementwise_backward_s)},
        },
    }


def _copied_links(run: RunInfo) -> dict[str, str]:
    """Where no link was measured: each one copied from the profile given to copy them from."""
    assert run.links_from is not None  # links are measured unless copied from a profile
    return dict.fromkeys(LINKS, f"copied from profile {run.links_from.name!r}")


def build_profile(run: RunInfo, measured: Measurements, cluster: ClusterInfo) -> dict:
    """The profile's JSON data; ``profile_from_dict`` must accept it."""
    fits = fit_all(measured, run.mesh_shape, run.axis_names, cluster.devices_per_node)
    mesh = mesh_key(run.mesh_shape)
    source = run.links_from
    if not fits.links and source is None:
        raise ValueError(f"no mesh axis of {run.mesh_shape} has more than one device and no profile to take links from")
    description = (
        f"Calibrated with `autoplan calibrate` on {len(cluster.hosts)} host(s), "
        f"{cluster.devices_per_node} rank(s) per host: mesh {mesh} ({', '.join(run.axis_names)}), "
        f"{run.backend}, {cluster.device_name}."
    )
    if source is not None:
        description += (
            f" Compute and eager costs measured on one device; links and {source.devices_per_node} devices "
            f"per node copied from profile {source.name!r}."
        )
    peak_flops, matmul = _within_bound(fits.peak_flops, fits.matmul.curve)
    (bandwidth,), memory = _within_bound((fits.memory_bandwidth,), fits.memory.curve)
    data = {
        "schema_version": SCHEMA_VERSION,
        "name": run.name,
        "description": description,
        "device": {
            "name": cluster.device_name,
            "memory_bytes": cluster.memory_bytes,
            "memory_bandwidth_bytes_per_s": _sig(bandwidth),
            "devices_per_node": cluster.devices_per_node if source is None else source.devices_per_node,
            "peak_flops": {dtype: _sig(flops) for dtype, flops in sorted(peak_flops.items())},
        },
        "efficiency": {
            "matmul": {"max": _sig(matmul.max), "half_at_flops": _sig(matmul.half_at)},
            "memory": {"max": _sig(memory.max), "half_at_bytes": _sig(memory.half_at)},
            "kernel_overhead_s": _sig(fits.overhead_s),
        },
        "dispatch": dispatch_section(measured, fits, run.device_type),
        "links": source.links if source is not None else {link: _link_table(fits.links[link]) for link in LINKS},
    }
    if source is None:  # a one-device run has no axis to record
        fallback = fits.links["intra_node"]
        data["axes"] = {
            mesh: [
                # A one-device axis never communicates (its cost is zero before any table is
                # read); it carries the intra-node figures only because the schema wants a table.
                {"name": name, "measured": bool(per_axis), "collectives": _link_table(per_axis or fallback)}
                for name, per_axis in zip(run.axis_names, fits.axes)
            ]
        }
    data["provenance"] = _provenance(run, measured, cluster, fits)
    return data


def _provenance(run: RunInfo, measured: Measurements, cluster: ClusterInfo, fits: Fits) -> dict:
    notes = [
        ("peak_flops and memory_bandwidth_bytes_per_s are the best throughput measured in the sweep, "
        "not datasheet figures; the efficiency curves are relative to them"),
    ]
    if run.device_type == "cpu":
        notes.append("all_to_all on CPU: DTensor runs it as all_gather + chunk on gloo; measured as it runs")
        notes.append("device memory: the host's RAM (or cgroup limit) divided by the ranks on the host")
    if run.quick:
        notes.append("--quick: a small sweep for tests; do not plan with this profile")
    extra = {}
    if run.links_from is not None:
        kind = "measured by a calibration" if run.links_from.measured else "published figures, not measured"
        notes.append(
            f"one device: no collective was measured; links and devices per node are profile "
            f"{run.links_from.name!r}'s ({kind})"
        )
        extra["links_from"] = run.links_from.name
    return {
        "measured": True,
        "method": METHOD,
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "hosts_sha256": list(cluster.hosts),
        "device_name": cluster.device_name,
        "device_names": list(cluster.device_names),
        "versions": run.versions,
        "backend": run.backend,
        "world_size": math.prod(run.mesh_shape),
        "mesh": list(run.mesh_shape),
        "axis_names": list(run.axis_names),
        "threads_per_rank": run.threads_per_rank,
        "quick": run.quick,
        "wall_time_s": round(run.wall_time_s, 1),
        "sweep": run.sweep.to_dict(),
        "links": dict(fits.link_sources) or _copied_links(run),
        "notes": notes,
        **extra,
        "fits": _fit_report(run, measured, fits),
        "measurements": _raw(run, measured),
    }


def _fit_report(run: RunInfo, measured: Measurements, fits: Fits) -> dict:
    def alpha_beta(fit: AlphaBetaFit) -> dict:
        return {**fit.to_dict(), "rel_rms": _sig(fit.rel_rms, 3), "samples": fit.samples}

    def saturation(fit: SaturationFit, unit: str) -> dict:
        return {"max": _sig(fit.curve.max), f"half_at_{unit}": _sig(fit.curve.half_at),
            "rel_rms": _sig(fit.rel_rms, 3), "samples": fit.samples}

    return {
        "axes": {
            name: {kind: alpha_beta(fit) for kind, fit in per_axis.items()}
            for name, per_axis in zip(run.axis_names, fits.axes)
            if per_axis
        },
        "links": {link: {kind: alpha_beta(fit) for kind, fit in table.items()} for link, table in fits.links.items()},
        "matmul": saturation(fits.matmul, "flops"),
        "memory": saturation(fits.memory, "bytes"),
        "optimizer": {"param_s": _sig(fits.optimizer.intercept), "s_per_byte": _sig(fits.optimizer.slope),
                      "rel_rms": _sig(fits.optimizer.rel_rms, 3), "samples": len(measured.dispatch.optimizer)},
    }


def _raw(run: RunInfo, measured: Measurements) -> dict:
    collectives: dict[str, dict[str, list]] = {}
    for sample in measured.collectives:
        per_kind = collectives.setdefault(run.axis_names[sample.axis], {})
        per_kind.setdefault(sample.kind, []).append([sample.nbytes, _sig(sample.seconds)])
    return {
        "columns": {
            "collectives": "axis -> kind -> [bytes (nccl-tests convention), seconds]",
            "matmul": "[dtype, m, k, n, seconds]",
            "memory": "[op, bytes read and written, seconds]",
            "optimizer": "[local bytes per parameter, seconds per parameter of AdamW.step()]",
            "dtensor_op_classes": "[op class, ATen op, forward seconds, backward seconds] per call",
        },
        "collectives": collectives,
        "matmul": [[s.dtype, *s.shape, _sig(s.seconds)] for s in measured.matmuls],
        "memory": [[s.op, s.nbytes, _sig(s.seconds)] for s in measured.memory_ops],
        "kernel_overhead_s": _sig(measured.overhead_s),
        "dtensor_forward_op_s": _sig(measured.dispatch.forward_op_s),
        "dtensor_backward_op_s": _sig(measured.dispatch.backward_op_s),
        "optimizer": [[s.nbytes, _sig(s.seconds)] for s in measured.dispatch.optimizer],
        "dtensor_op_classes": [
            [s.op_class, s.op, _sig(s.forward_s), _sig(s.backward_s)] for s in measured.dispatch.op_classes
        ],
        **({"compiled": measured.compiled.raw} if measured.compiled is not None else {}),
    }


def _fit_collective(samples: list[CollectiveSample]) -> AlphaBetaFit:
    return fit_alpha_beta(
        [s.nbytes for s in samples],
        [bus_factor(s.kind, s.group_size) for s in samples],
        [s.seconds for s in samples],
    )


def _link_table(fits: dict[str, AlphaBetaFit]) -> dict:
    return {kind: fits[kind].to_dict() for kind in COLLECTIVES}


def _sig(value: float, digits: int = 4) -> float:
    """Rounded to a few significant digits: more would only record measurement noise."""
    return float(f"{value:.{digits}g}")
