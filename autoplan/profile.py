"""Cluster profiles: what one device and the links between devices can do.

A profile is a JSON file in ``cost_models/`` (or anywhere, given by path), validated on
load. Its schema is the ``ClusterProfile`` dataclass below; ``h100-sxm`` is the default.

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

``op_classes`` (optional) prices each op class of ``op_classes.py`` by its own measured
figures; ops of no class, and every op where the table is absent (the GPU presets, older
profiles), pay the generic ``forward_op_s`` / ``backward_op_s``.

Schema 1 profiles lack it and are refused with the fix (re-calibrate, or add the object).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from autoplan.errors import ProfileError
from autoplan.op_classes import OP_CLASSES

COST_MODELS_DIR = Path(__file__).resolve().parent.parent / "cost_models"
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
    """Fixed costs of one traced op of one class (``op_classes.py``)."""

    forward_op_s: float
    """Time of one forward op of the class on tiny tensors, autograd recording included."""
    backward_op_s: float
    """Backward time of one such op (its derivative ops and the autograd engine's work)."""


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


def load_profile(name_or_path: str | None = None) -> ClusterProfile:
    """A profile by name (a file in ``cost_models/``) or by path; None gives the default."""
    text = name_or_path or DEFAULT_PROFILE
    path = Path(text)
    if not path.suffix:
        path = COST_MODELS_DIR / f"{text}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in COST_MODELS_DIR.glob("*.json")))
        raise ProfileError(
            f"no cluster profile {text!r} (looked for {path})",
            hint=f"pass one of: {known}, or the path of a profile JSON file",
        )
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ProfileError(f"could not read cluster profile {path}: {err.strerror or err}", hint="check the file's permissions") from err
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProfileError(f"cluster profile {path} is not valid JSON ({err})", hint=_REMAKE) from err
    return profile_from_dict(data, source=str(path))


def profile_from_dict(data: dict, source: str = "<dict>") -> ClusterProfile:
    """Validate a profile's JSON data; every problem is a ProfileError naming the key."""
    if not isinstance(data, dict):
        raise ProfileError(f"cluster profile {source}: expected a JSON object, got {type(data).__name__}", hint=_REMAKE)
    read = _Reader(source)
    version = read.need(data, "schema_version", "")
    if version == 1:
        raise ProfileError(
            f"cluster profile {source} has schema_version 1, expected {SCHEMA_VERSION}: it lacks the "
            "eager-execution costs (dispatch: per-op, backward and optimizer fixed times)",
            hint="re-create it with `autoplan calibrate`, or add a \"dispatch\" object as in "
            "cost_models/h100-sxm.json and set schema_version to 2",
        )
    if version != SCHEMA_VERSION:
        raise ProfileError(
            f"cluster profile {source} has schema_version {version!r}, expected {SCHEMA_VERSION}",
            hint="upgrade autoplan or re-create the profile with `autoplan calibrate`",
        )
    device = read.need_object(data, "device", "")
    eff = read.need_object(data, "efficiency", "")
    links_data = read.need_object(data, "links", "")
    links = {link: read.link_table(read.need_object(links_data, link, "links."), f"links.{link}.") for link in LINKS}
    peak = read.need_object(device, "peak_flops", "device.")
    if "float32" not in peak:
        raise ProfileError(f"cluster profile {source} lacks device.peak_flops.float32", hint="add the float32 peak (it is the fallback for other dtypes)")
    matmul = read.need_object(eff, "matmul", "efficiency.")
    memory = read.need_object(eff, "memory", "efficiency.")
    dispatch = read.need_object(data, "dispatch", "")
    return ClusterProfile(
        name=str(read.need(data, "name", "")),
        device_name=str(read.need(device, "name", "device.")),
        memory_bytes=int(read.positive(device, "memory_bytes", "device.")),
        memory_bandwidth_bytes_per_s=read.positive(device, "memory_bandwidth_bytes_per_s", "device."),
        devices_per_node=int(read.positive(device, "devices_per_node", "device.")),
        peak_flops={k: read.positive(peak, k, "device.peak_flops.") for k in sorted(peak)},
        matmul_efficiency=Saturation(read.positive(matmul, "max", "efficiency.matmul."), read.positive(matmul, "half_at_flops", "efficiency.matmul.")),
        memory_efficiency=Saturation(read.positive(memory, "max", "efficiency.memory."), read.positive(memory, "half_at_bytes", "efficiency.memory.")),
        kernel_overhead_s=read.non_negative(eff, "kernel_overhead_s", "efficiency."),
        links=links,
        dispatch=DispatchCost(
            forward_op_s=read.non_negative(dispatch, "forward_op_s", "dispatch."),
            backward_op_s=read.non_negative(dispatch, "backward_op_s", "dispatch."),
            optimizer_param_s=read.non_negative(dispatch, "optimizer_param_s", "dispatch."),
            optimizer_bytes_per_s=read.positive(dispatch, "optimizer_bytes_per_s", "dispatch."),
            overlaps_device=read.boolean(dispatch, "overlaps_device", "dispatch."),
            op_classes=read.op_classes(dispatch.get("op_classes", {})),
        ),
        provenance=dict(read.optional_object(data, "provenance")),
        axes=read.axes(data.get("axes", {})),
    )



def mesh_key(mesh_shape: tuple[int, ...]) -> str:
    """The ``axes`` key of a mesh shape: (2, 4) -> "2x4"."""
    return "x".join(str(size) for size in mesh_shape)


class _Reader:
    """Reads one profile's JSON, naming the exact key (``links.intra_node.all_reduce.latency_s``)
    of anything missing or malformed."""

    def __init__(self, source: str):
        self.source = source

    def need(self, mapping: dict, key: str, where: str):
        if not isinstance(mapping, dict) or key not in mapping:
            raise ProfileError(f"cluster profile {self.source} lacks {where}{key}", hint=_FIX)
        return mapping[key]

    def need_object(self, mapping: dict, key: str, where: str) -> dict:
        value = self.need(mapping, key, where)
        if not isinstance(value, dict):
            raise ProfileError(f"cluster profile {self.source}: expected an object at {where}{key}, got {value!r}", hint=_FIX)
        return value

    def optional_object(self, mapping: dict, key: str) -> dict:
        value = mapping.get(key, {})
        if not isinstance(value, dict):
            raise ProfileError(f"cluster profile {self.source}: expected an object at {key}, got {value!r}", hint=_FIX)
        return value

    def positive(self, mapping: dict, key: str, where: str) -> float:
        value = self._number(mapping, key, where)
        if value <= 0:
            raise ProfileError(f"cluster profile {self.source}: expected a positive number at {where}{key}, got {value!r}", hint=_FIX)
        return value

    def non_negative(self, mapping: dict, key: str, where: str) -> float:
        value = self._number(mapping, key, where)
        if value < 0:
            raise ProfileError(f"cluster profile {self.source}: expected a number >= 0 at {where}{key}, got {value!r}", hint=_FIX)
        return value

    def boolean(self, mapping: dict, key: str, where: str) -> bool:
        value = self.need(mapping, key, where)
        if not isinstance(value, bool):
            raise ProfileError(f"cluster profile {self.source}: expected true or false at {where}{key}, got {value!r}", hint=_FIX)
        return value

    def link_table(self, per_link: dict, where: str) -> dict[str, LinkCost]:
        table = {}
        for kind in COLLECTIVES:
            cost = self.need_object(per_link, kind, where)
            table[kind] = LinkCost(
                self.positive(cost, "latency_s", f"{where}{kind}."),
                self.positive(cost, "bus_bandwidth_bytes_per_s", f"{where}{kind}."),
            )
        return table

    def op_classes(self, data) -> dict[str, OpClassCost]:
        where = "dispatch.op_classes"
        if not isinstance(data, dict):
            raise ProfileError(f"cluster profile {self.source}: expected an object at {where}, got {data!r}", hint=_FIX)
        table = {}
        for name, entry in data.items():
            if name not in OP_CLASSES:
                raise ProfileError(
                    f"cluster profile {self.source}: unknown op class {name!r} at {where}, expected one of {', '.join(OP_CLASSES)}",
                    hint="remove the entry or re-create the profile with `autoplan calibrate`",
                )
            if not isinstance(entry, dict):
                raise ProfileError(f"cluster profile {self.source}: expected an object at {where}.{name}, got {entry!r}", hint=_FIX)
            table[name] = OpClassCost(
                self.non_negative(entry, "forward_op_s", f"{where}.{name}."),
                self.non_negative(entry, "backward_op_s", f"{where}.{name}."),
            )
        return table

    def axes(self, data) -> dict[tuple[int, ...], tuple[dict[str, LinkCost], ...]]:
        if not isinstance(data, dict):
            raise ProfileError(f"cluster profile {self.source}: expected an object at axes, got {data!r}", hint=_FIX)
        tables = {}
        for key, per_axis in data.items():
            parts = str(key).split("x")
            if not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ProfileError(f"cluster profile {self.source}: expected a mesh shape like 2x4 as a key of axes, got {key!r}", hint=_FIX)
            shape = tuple(int(p) for p in parts)
            if not isinstance(per_axis, list) or len(per_axis) != len(shape):
                raise ProfileError(
                    f"cluster profile {self.source}: expected a list of {len(shape)} axes at axes.{key}, got {per_axis!r}",
                    hint=_FIX,
                )
            tables[shape] = tuple(
                self.link_table(self.need_object(entry, "collectives", f"axes.{key}[{axis}]."), f"axes.{key}[{axis}].collectives.")
                for axis, entry in enumerate(per_axis)
            )
        return tables

    def _number(self, mapping: dict, key: str, where: str) -> float:
        value = self.need(mapping, key, where)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ProfileError(f"cluster profile {self.source}: expected a finite number at {where}{key}, got {value!r}", hint=_FIX)
        return float(value)
