"""Cluster profiles: what one device and the links between devices can do.

A profile is a JSON file in ``cost_models/`` (or anywhere, given by path), validated on
load against ``autoplan/schemas/profile.schema.json`` (which also bounds every figure by what
is physical); ``ClusterProfile`` below is its parsed form. ``h100-sxm`` is the default.

Collective costs come in two tables. ``links`` (required) prices a collective by the link
its groups use, intra-node or inter-node, and serves any mesh. ``axes`` (optional, written
by ``autoplan calibrate``) holds what was measured on each axis of one mesh shape, keyed
by that shape ("2x4"); the cost stage prefers it when planning on that very shape, where it
also captures what a link class cannot (two intra-node axes of different group sizes or
strides, an all_to_all that DTensor runs as all_gather on gloo)::

    "axes": {"2x4": [{"name": "dp", "collectives": {"all_reduce": {"latency_s": ..,
                                                                   "bus_bandwidth_bytes_per_s": ..}, ...}},
                     {"name": "tp", "collectives": {...}}]}

``dispatch`` (schema 2) holds the fixed costs of running a plan eagerly through DTensor,
which a plain kernel's ``kernel_overhead_s`` misses: sharding propagation, redistribute
planning and wrapping on every op, autograd's backward ops, and ``AdamW.step()``'s ops on
every parameter. ``autoplan calibrate`` measures them on the mesh (``calibrate/dispatch.py``)::

    "dispatch": {"forward_op_s": .., "backward_op_s": .., "optimizer_param_s": ..,
                 "optimizer_bytes_per_s": .., "overlaps_device": false,
                 "op_classes": {"view": {"forward_op_s": .., "backward_op_s": ..}, ...}}

``op_classes`` (optional) prices each op class of ``cost/op_classes.py`` by its own measured
figures; ops of no class, and every op where the table is absent (the GPU presets, older
profiles), pay the generic ``forward_op_s`` / ``backward_op_s``.

``dispatch.compiled`` (optional) holds what remains of those fixed costs where ops run
inside a ``torch.compile`` graph (``suggest --compile block|whole``, ``cost/regime.py``),
measured by ``autoplan calibrate`` (``calibrate/compiled.py``); a profile without it gets
``CompiledCost.derived``'s defaults, derived from its eager figures (docs/compile.md)::

    "compiled": {"forward_op_s": .., "backward_op_s": .., "graph_call_s": .., "fused_traffic": ..,
                 "op_classes": {"matmul": {"forward_op_s": .., "backward_op_s": ..}, ...}}

Schema 1 profiles lack it and are refused with the fix (re-calibrate, or add the object).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoplan.errors import ProfileError
from autoplan.validation import check_schema, read_json

COST_MODELS_DIR = Path(__file__).resolve().parents[2] / "cost_models"
DEFAULT_PROFILE = "h100-sxm"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LINKS = ("intra_node", "inter_node")
SCHEMA_VERSION = 2
_REMAKE = "re-create it with `autoplan calibrate` or restore it from cost_models/"
_FIX = "re-create it with `autoplan calibrate` or fix the file"


@dataclass(frozen=True, slots=True)
class LinkCost:
    latency_s: float
    """Fixed time of one collective call, as seen through PyTorch."""
    bus_bandwidth_bytes_per_s: float
    """nccl-tests bus bandwidth: time = latency + factor(n) * bytes / bus bandwidth."""


@dataclass(frozen=True, slots=True)
class Saturation:
    """Efficiency that grows with work size: ``max * x / (x + half_at)``."""

    max: float
    half_at: float

    def at(self, amount: float) -> float:
        return self.max * amount / (amount + self.half_at) if amount > 0 else self.max


@dataclass(frozen=True, slots=True)
class OpClassCost:
    """Fixed costs of one traced op of one class (``cost/op_classes.py``)."""

    forward_op_s: float
    """Time of one forward op of the class on tiny tensors, autograd recording included."""
    backward_op_s: float
    """Backward time of one such op (its derivative ops and the autograd engine's work)."""


GRAPH_CALL_OPS = 4
"""Default ``CompiledCost.graph_call_s``: one compiled graph's call (guards, runtime wrappers,
the autograd function), forward and backward, costs about this many eager ops' fixed time."""
FUSED_TRAFFIC = 1 / 3
"""Default ``CompiledCost.fused_traffic``: inductor fuses a run of elementwise ops into one
kernel that reads its inputs and writes its output once; runs in a transformer block are
about three ops long (scale, mask, add; mul, silu, mul), so a third of the eager traffic
is left per op."""
FUSED_CLASSES = ("view", "elementwise")
"""Op classes inductor folds into their neighbours' kernels: no launch of their own."""


@dataclass(frozen=True, slots=True)
class CompiledCost:
    """Fixed costs where ops run inside a ``torch.compile`` graph (``cost/regime.py``): the
    DTensor dispatch, sharding propagation and autograd recording ran once, at compile
    time; what remains is each kernel's call and each graph's call."""

    forward_op_s: float
    """Fixed time of one op inside a compiled graph, forward: its kernel's call."""
    backward_op_s: float
    """The same for its backward."""
    graph_call_s: float
    """Fixed time of one compiled graph's call, forward and backward together."""
    fused_traffic: float
    """Fraction of an elementwise op's eager memory traffic left once it is fused."""
    op_classes: dict[str, OpClassCost] = field(default_factory=dict)
    """Op class -> its own fixed costs inside a graph; a class not here pays the generic ones
    (``FUSED_CLASSES`` nothing)."""
    measured: bool = False
    """True where ``autoplan calibrate`` measured them; False for ``derived``'s defaults."""

    def fixed_seconds(self, op_class: str) -> tuple[float, float]:
        """(forward, backward) fixed time of one op of ``op_class`` inside a compiled graph."""
        own = self.op_classes.get(op_class)
        if own:
            return own.forward_op_s, own.backward_op_s
        if op_class in FUSED_CLASSES:
            return 0.0, 0.0
        return self.forward_op_s, self.backward_op_s

    @staticmethod
    def derived(eager_forward_s: float, eager_backward_s: float, kernel_overhead_s: float) -> CompiledCost:
        """The default where a profile has no measured figures: every op that is not fused
        pays one kernel call (``kernel_overhead_s``) forward and one backward; a graph's call
        ``GRAPH_CALL_OPS`` eager ops' fixed time; fused ops keep ``FUSED_TRAFFIC`` of their traffic."""
        return CompiledCost(kernel_overhead_s, kernel_overhead_s, GRAPH_CALL_OPS * (eager_forward_s + eager_backward_s),
                            FUSED_TRAFFIC)


@dataclass(frozen=True, slots=True)
class DispatchCost:
    """Fixed costs of eager DTensor execution, per op and per parameter (``calibrate/dispatch.py``)."""

    forward_op_s: float
    """Time of one forward DTensor op on tiny tensors (dispatch, sharding propagation, wrapping,
    autograd recording and the kernel launch): the fixed part of every forward op, views included."""
    backward_op_s: float
    """Fixed time of the backward of one forward op that carries a gradient (its derivative ops
    and the autograd engine's work), per forward op."""
    optimizer_param_s: float
    """Fixed time of ``AdamW.step()`` per parameter (about ten DTensor ops)."""
    optimizer_bytes_per_s: float
    """Local parameter bytes ``AdamW.step()`` updates per second, once the fixed time is paid."""
    overlaps_device: bool
    """True where ops run asynchronously on a device (CUDA): the host's fixed time and the
    kernel's time overlap, and an op costs the larger of the two. False on CPU, where the
    rank's own thread does both, one after the other."""
    op_classes: dict[str, OpClassCost] = field(default_factory=dict)
    """Op class -> its own fixed costs; a class not here pays ``forward_op_s`` / ``backward_op_s``."""
    compiled: CompiledCost | None = None
    """Measured fixed costs inside a compiled graph; None: ``compiled_costs`` derives them."""

    def compiled_costs(self, kernel_overhead_s: float) -> CompiledCost:
        """The fixed costs inside a compiled graph: measured, else derived from the eager ones."""
        return self.compiled or CompiledCost.derived(self.forward_op_s, self.backward_op_s, kernel_overhead_s)

    def fixed_seconds(self, op_class: str) -> tuple[float, float]:
        """(forward, backward) fixed time of one op of ``op_class``."""
        own = self.op_classes.get(op_class)
        return (own.forward_op_s, own.backward_op_s) if own else (self.forward_op_s, self.backward_op_s)

    def op_seconds(self, fixed_s: float, kernel_overhead_s: float, work_s: float) -> float:
        """Time of one op, or of one op's backward: its fixed host time with its kernel's."""
        if self.overlaps_device:
            return max(fixed_s, kernel_overhead_s + work_s) if work_s > 0 else fixed_s
        return fixed_s + work_s


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    device_name: str
    memory_bytes: int
    """Device memory: the default per-device budget."""
    memory_bandwidth_bytes_per_s: float
    devices_per_node: int
    peak_flops: dict[str, float]
    """Dense peak per dtype name ("bfloat16", "float32", ...)."""
    matmul_efficiency: Saturation
    memory_efficiency: Saturation
    kernel_overhead_s: float
    links: dict[str, dict[str, LinkCost]]
    """"intra_node" / "inter_node" -> collective -> cost."""
    dispatch: DispatchCost
    """Fixed costs of eager DTensor execution."""
    provenance: dict
    axes: dict[tuple[int, ...], tuple[dict[str, LinkCost], ...]] = field(default_factory=dict)
    """Measured per-axis costs: mesh shape -> per axis, collective -> cost (may be empty)."""

    def flops_for(self, dtype_name: str) -> float:
        return self.peak_flops.get(dtype_name) or self.peak_flops["float32"]


def profile_path(name_or_path: str | None = None) -> Path:
    """The file a profile name (a file in ``cost_models/``) or path stands for; None gives the default."""
    text = name_or_path or DEFAULT_PROFILE
    path = Path(text)
    return COST_MODELS_DIR / f"{text}.json" if not path.suffix else path


def load_profile(name_or_path: str | None = None) -> ClusterProfile:
    """A profile by name (a file in ``cost_models/``) or by path; None gives the default."""
    text = name_or_path or DEFAULT_PROFILE
    path = profile_path(text)
    if not path.is_file() and not path.is_dir():
        known = ", ".join(sorted(p.stem for p in COST_MODELS_DIR.glob("*.json")))
        raise ProfileError(
            f"no cluster profile {text!r} (looked for {path})",
            hint=f"pass one of: {known}, or the path of a profile JSON file",
        )
    data = read_json(path, ProfileError, "cluster profile", "pass the path of a profile JSON file", _REMAKE)
    return profile_from_dict(data, source=str(path))


def profile_from_dict(data: dict, source: str = "<dict>") -> ClusterProfile:
    """Validate a profile's JSON data (``profile.schema.json``, then what a schema cannot
    say) and build it; every problem is a ProfileError naming the key."""
    if not isinstance(data, dict):
        raise ProfileError(f"cluster profile {source}: expected a JSON object, got {type(data).__name__}", hint=_REMAKE)
    if "schema_version" not in data:
        raise ProfileError(f"cluster profile {source} lacks schema_version", hint=_FIX)
    version = data["schema_version"]
    if version == 1:
        raise ProfileError(
            f"cluster profile {source} has schema_version 1, expected {SCHEMA_VERSION}: it lacks the "
            "eager-execution costs (dispatch: per-op, backward and optimizer fixed times)",
            hint="re-create it with `autoplan calibrate`, or add a \"dispatch\" object as in "
            "cost_models/h100-sxm.json and set schema_version to 2",
        )
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ProfileError(
            f"cluster profile {source} has schema_version {version!r}, expected {SCHEMA_VERSION}",
            hint="upgrade autoplan or re-create the profile with `autoplan calibrate`",
        )
    check_schema(data, "profile", ProfileError, f"cluster profile {source}", _FIX)
    axes = {}
    for key, per_axis in data.get("axes", {}).items():
        shape = tuple(int(p) for p in key.split("x"))
        if len(per_axis) != len(shape):
            raise ProfileError(
                f"cluster profile {source}: expected a list of {len(shape)} axes at axes.{key}, got {len(per_axis)}", hint=_FIX
            )
        axes[shape] = tuple(_link_table(entry["collectives"]) for entry in per_axis)
    device, eff, dispatch = data["device"], data["efficiency"], data["dispatch"]
    return ClusterProfile(
        name=data["name"],
        device_name=device["name"],
        memory_bytes=int(device["memory_bytes"]),
        memory_bandwidth_bytes_per_s=float(device["memory_bandwidth_bytes_per_s"]),
        devices_per_node=int(device["devices_per_node"]),
        peak_flops={k: float(v) for k, v in sorted(device["peak_flops"].items())},
        matmul_efficiency=Saturation(float(eff["matmul"]["max"]), float(eff["matmul"]["half_at_flops"])),
        memory_efficiency=Saturation(float(eff["memory"]["max"]), float(eff["memory"]["half_at_bytes"])),
        kernel_overhead_s=float(eff["kernel_overhead_s"]),
        links={link: _link_table(data["links"][link]) for link in LINKS},
        dispatch=DispatchCost(
            forward_op_s=float(dispatch["forward_op_s"]),
            backward_op_s=float(dispatch["backward_op_s"]),
            optimizer_param_s=float(dispatch["optimizer_param_s"]),
            optimizer_bytes_per_s=float(dispatch["optimizer_bytes_per_s"]),
            overlaps_device=dispatch["overlaps_device"],
            op_classes=_op_class_table(dispatch.get("op_classes", {})),
            compiled=_compiled(dispatch.get("compiled")),
        ),
        provenance=dict(data.get("provenance", {})),
        axes=axes,
    )


def mesh_key(mesh_shape: tuple[int, ...]) -> str:
    """The ``axes`` key of a mesh shape: (2, 4) -> "2x4"."""
    return "x".join(str(size) for size in mesh_shape)


def _op_class_table(table: dict) -> dict[str, OpClassCost]:
    return {name: OpClassCost(float(c["forward_op_s"]), float(c["backward_op_s"])) for name, c in table.items()}


def _compiled(data: dict | None) -> CompiledCost | None:
    if data is None:
        return None
    return CompiledCost(
        forward_op_s=float(data["forward_op_s"]),
        backward_op_s=float(data["backward_op_s"]),
        graph_call_s=float(data["graph_call_s"]),
        fused_traffic=float(data["fused_traffic"]),
        op_classes=_op_class_table(data.get("op_classes", {})),
        measured=bool(data.get("measured", False)),
    )


def _link_table(per_link: dict) -> dict[str, LinkCost]:
    return {
        kind: LinkCost(float(per_link[kind]["latency_s"]), float(per_link[kind]["bus_bandwidth_bytes_per_s"]))
        for kind in COLLECTIVES
    }
