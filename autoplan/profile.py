"""Cluster profiles: what one device and the links between devices can do.

A profile is a JSON file in ``cost_models/`` (or anywhere, given by path), validated on
load. Its schema is the ``ClusterProfile`` dataclass below; ``h100-sxm`` is the default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import ProfileError

COST_MODELS_DIR = Path(__file__).resolve().parent.parent / "cost_models"
DEFAULT_PROFILE = "h100-sxm"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LINKS = ("intra_node", "inter_node")


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
    provenance: dict

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
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ProfileError(f"cluster profile {path} is not valid JSON ({err})", hint="re-create it with `autoplan calibrate` or restore it") from err
    return profile_from_dict(data, source=str(path))


def profile_from_dict(data: dict, source: str = "<dict>") -> ClusterProfile:
    def need(mapping, key, where):
        if not isinstance(mapping, dict) or key not in mapping:
            raise ProfileError(f"cluster profile {source} lacks {where}{key}", hint="re-create it with `autoplan calibrate` or fix the file")
        return mapping[key]

    def positive(value, where):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ProfileError(f"cluster profile {source}: expected a positive number at {where}, got {value!r}", hint="fix the file")
        return float(value)

    if need(data, "schema_version", "") != 1:
        raise ProfileError(f"cluster profile {source} has schema_version {data['schema_version']!r}, expected 1", hint="upgrade autoplan or re-create the profile")
    device = need(data, "device", "")
    eff = need(data, "efficiency", "")
    links_data = need(data, "links", "")
    links = {}
    for link in LINKS:
        per_link = need(links_data, link, "links.")
        links[link] = {
            kind: LinkCost(
                positive(need(need(per_link, kind, f"links.{link}."), "latency_s", f"links.{link}.{kind}."), f"links.{link}.{kind}.latency_s"),
                positive(need(per_link[kind], "bus_bandwidth_bytes_per_s", f"links.{link}.{kind}."), f"links.{link}.{kind}.bus_bandwidth_bytes_per_s"),
            )
            for kind in COLLECTIVES
        }
    peak = need(device, "peak_flops", "device.")
    if "float32" not in peak:
        raise ProfileError(f"cluster profile {source} lacks device.peak_flops.float32", hint="add the float32 peak (it is the fallback for other dtypes)")
    matmul = need(eff, "matmul", "efficiency.")
    memory = need(eff, "memory", "efficiency.")
    return ClusterProfile(
        name=str(need(data, "name", "")),
        device_name=str(need(device, "name", "device.")),
        memory_bytes=int(positive(need(device, "memory_bytes", "device."), "device.memory_bytes")),
        memory_bandwidth_bytes_per_s=positive(need(device, "memory_bandwidth_bytes_per_s", "device."), "device.memory_bandwidth_bytes_per_s"),
        devices_per_node=int(positive(need(device, "devices_per_node", "device."), "device.devices_per_node")),
        peak_flops={k: positive(v, f"device.peak_flops.{k}") for k, v in sorted(peak.items())},
        matmul_efficiency=Saturation(positive(need(matmul, "max", "efficiency.matmul."), "efficiency.matmul.max"), positive(need(matmul, "half_at_flops", "efficiency.matmul."), "efficiency.matmul.half_at_flops")),
        memory_efficiency=Saturation(positive(need(memory, "max", "efficiency.memory."), "efficiency.memory.max"), positive(need(memory, "half_at_bytes", "efficiency.memory."), "efficiency.memory.half_at_bytes")),
        kernel_overhead_s=float(need(eff, "kernel_overhead_s", "efficiency.")),
        links=links,
        provenance=dict(data.get("provenance", {})),
    )
