"""What remains of an op's fixed cost under ``torch.compile`` (``profile.CompiledCost``).

Compiled, DTensor's dispatch, sharding propagation and autograd recording run once, when
dynamo and AOTAutograd trace the graph; a step then pays each kernel's call, each graph's
call (guards, runtime wrappers, the autograd function), and for elementwise ops, which
inductor fuses, a share of their eager traffic. Measured on the calibrated mesh, every
rank at once, with inductor (the backend people train with), compiled as a block is
(``fullgraph``, static shapes), on tiny DTensors split on the first mesh axis:

    figure             what is timed
    matmul op          chains of 1 and ``CHAIN`` ``torch.mm`` on a replicated weight,
                       forward and backward: the slope per op (an extern kernel's call)
    graph_call_s       the one-op chain's forward + backward less its op: one graph's call
    elementwise op     a chain of ``CHAIN`` multiplies (one fused kernel), less the graph's
                       call, per op: what a fused op still costs (about nothing)
    fused_traffic      ``CHAIN`` multiplies on ``LARGE`` elements (plain tensors: traffic
                       only), forward, eager and compiled (one fused pass): the fused
                       pass's time against one eager op's, over ``FUSED_RUN`` (the ops a
                       run in a model fuses: ``profile.FUSED_TRAFFIC``'s three), the share
                       of its eager traffic a fused op still costs

Each compiled function is compiled once (warm-up repeats hold its compilation) and timed
as the eager points are (``Timer.seconds_of_parts``: the slowest rank's median). Compiling
takes most of the time: four small graphs, seconds each on a GPU host, about a minute
with 8 ranks sharing 2 CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.calibrate.progress import Progress
from autoplan.calibrate.timing import Timer
from autoplan.cost.profile import FUSED_TRAFFIC

CHAIN = 16
"""Ops in the long chains (the short one has 1): the slope between them is one op's cost."""
TINY = 8
"""Local rows and columns of the chains' tensors: kernels take no time."""
LARGE = 1 << 20
"""Elements of the traffic point's tensor (4 MiB of float32): the kernels' traffic dominates."""
FUSED_RUN = round(1 / FUSED_TRAFFIC)
"""Elementwise ops a fused kernel stands for in a model (``profile.FUSED_TRAFFIC``)."""
BACKEND = "inductor"
POINTS = 4


@dataclass(frozen=True, slots=True)
class CompiledSample:
    """The fixed costs inside a compiled graph, measured on one mesh (``CompiledCost``'s fields)."""

    matmul_forward_s: float
    matmul_backward_s: float
    graph_call_s: float
    elementwise_forward_s: float
    elementwise_backward_s: float
    fused_traffic: float
    raw: dict
    """What was timed, seconds per call: (forward, backward) per chain, and the traffic point's."""


def count_compiled_points() -> int:
    return POINTS


def measure_compiled(mesh: DeviceMesh, timer: Timer, progress: Progress) -> CompiledSample:
    """Every rank compiles and times the same graphs at once; every rank returns the same figures."""
    raw: dict[str, tuple[float, ...]] = {}
    with torch.enable_grad():
        for name, length in (("mm", 1), ("mm", CHAIN), ("mul", CHAIN)):
            forward, backward = _chain(mesh, name, length)
            raw[f"{name}x{length}"] = timer.seconds_of_parts(forward, backward)
            progress.step(f"compiled ({BACKEND}) chain of {length} DTensor {name}, forward and backward")
    with torch.no_grad():
        eager, compiled = _traffic_pair(mesh.device_type)
        raw["traffic"] = (timer.seconds(eager), timer.seconds(compiled))
        progress.step(f"compiled ({BACKEND}) against eager: {CHAIN} multiplies on {LARGE} elements")
    return sample_from(raw)


def sample_from(raw: dict) -> CompiledSample:
    """The figures from the raw timings (each clamped at 0: a slope lost in noise is no cost)."""
    (f1, b1), (fk, bk), (pf, pb) = raw["mmx1"], raw[f"mmx{CHAIN}"], raw[f"mulx{CHAIN}"]
    mm_f, mm_b = max(0.0, (fk - f1) / (CHAIN - 1)), max(0.0, (bk - b1) / (CHAIN - 1))
    call_f, call_b = max(0.0, f1 - mm_f), max(0.0, b1 - mm_b)
    eager_s, compiled_s = raw["traffic"]
    return CompiledSample(
        matmul_forward_s=mm_f,
        matmul_backward_s=mm_b,
        graph_call_s=call_f + call_b,
        elementwise_forward_s=max(0.0, (pf - call_f) / CHAIN),
        elementwise_backward_s=max(0.0, (pb - call_b) / CHAIN),
        fused_traffic=min(1.0, max(0.0, compiled_s / (eager_s / CHAIN) / FUSED_RUN)) if eager_s > 0 else FUSED_TRAFFIC,
        raw={k: list(v) for k, v in raw.items()},
    )


def _chain(mesh: DeviceMesh, name: str, length: int):
    """(forward, backward) closures over one compiled chain of ``length`` DTensor ops."""
    device = mesh.device_type
    split = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    replicated = [Replicate()] * mesh.ndim
    x = DTensor.from_local(torch.rand(TINY, TINY, device=device), mesh, split, run_check=False).requires_grad_()
    weight = DTensor.from_local(torch.full((TINY, TINY), 0.1, device=device), mesh, replicated, run_check=False)
    weight.requires_grad_()
    seed = DTensor.from_local(torch.ones(TINY, TINY, device=device), mesh, split, run_check=False)

    def chain(h, w):
        for _ in range(length):
            h = torch.mm(h, w) if name == "mm" else h * 0.999
        return h

    compiled = torch.compile(chain, backend=BACKEND, fullgraph=True, dynamic=False)

    def forward():
        return compiled(x, weight)

    def backward(h):
        h.backward(seed)
        x.grad = weight.grad = None

    return forward, backward


def _traffic_pair(device: str):
    """(eager, compiled) closures over ``CHAIN`` multiplies of a ``LARGE`` plain tensor."""
    x = torch.rand(LARGE, device=device)

    def chain(h):
        for _ in range(CHAIN):
            h = h * 0.999
        return h

    compiled = torch.compile(chain, backend=BACKEND, fullgraph=True, dynamic=False)
    return (lambda: chain(x)), (lambda: compiled(x))
