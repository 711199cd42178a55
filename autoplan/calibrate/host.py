"""What the run ran on: hosts (hashed), device name and memory, library versions.

Host names are recorded only as short SHA-256 hashes: a profile says "measured on these
two hosts" (and can be compared with another run's hosts) without publishing names.

Device memory is the per-device budget the planner uses by default: a GPU's total memory,
or, on CPU, the host's RAM (capped by the container's cgroup limit) divided by the ranks
that share it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

HASH_CHARS = 12


@dataclass(frozen=True, slots=True)
class RankInfo:
    """What one rank sees of its host and device."""

    host_hash: str
    device_name: str
    memory_bytes: int
    """The device's memory (GPU) or the host's usable RAM (CPU), before sharing."""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """All ranks' view, reduced to what a profile records."""

    hosts: tuple[str, ...]
    """Hashed host names, sorted, one per host."""
    devices_per_node: int
    """Most ranks on one host."""
    device_name: str
    memory_bytes: int
    """Per-device budget: the smallest over ranks, shared among a CPU host's ranks."""
    device_names: tuple[str, ...]
    """Distinct device names seen (more than one means a mixed cluster)."""


def hash_host(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]


def local_rank_info(device: torch.device) -> RankInfo:
    host = hash_host(socket.gethostname())
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return RankInfo(host, props.name, int(props.total_memory))
    return RankInfo(host, f"CPU: {cpu_model()}", host_memory_bytes())


def gather_cluster_info(device: torch.device) -> ClusterInfo:
    """Every rank's ``RankInfo``, combined (a collective: call it on every rank)."""
    infos: list[RankInfo | None] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, local_rank_info(device))
    gathered = [info for info in infos if info is not None]
    assert len(gathered) == len(infos)  # all_gather_object fills every rank's slot
    return combine(gathered, device.type)


def combine(infos: list[RankInfo], device_type: str) -> ClusterInfo:
    per_host: dict[str, int] = {}
    for info in infos:
        per_host[info.host_hash] = per_host.get(info.host_hash, 0) + 1
    if device_type == "cuda":
        memory = min(info.memory_bytes for info in infos)
    else:
        memory = min(info.memory_bytes // per_host[info.host_hash] for info in infos)
    names = tuple(sorted({info.device_name for info in infos}))
    return ClusterInfo(tuple(sorted(per_host)), max(per_host.values()), names[0], memory, names)


def versions() -> dict[str, str | None]:
    """torch, CUDA and NCCL versions (None where not built in), and Python's."""
    nccl = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):
            nccl = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": platform.python_version(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_memory_bytes() -> int:
    """Physical RAM, or the cgroup memory limit where a container sets a lower one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
