"""What the mesh gains: the predicted speed-up over one device, and why, in words, when it is about 1x.

One device's step is the cost stage's own figure for the whole step on one device: each
op's compute under its all-replicated strategy (every device running the whole op is what
one device would run), no communication. The plan's step time over it is the speed-up.

Two cases say why in words: a plan that replicates everything (every device computes the
same whole step: 1.0x by construction, known from the plan file alone), and a plan that
splits work yet is predicted less than ``GAINS_LITTLE`` times faster than one device (the
split saves little compute, because fixed per-op cost, which every device pays whatever
the split, is most of it, and communication takes back part of what it saves).
"""

from __future__ import annotations

from autoplan.explain.mfu import COMPUTE_ROWS
from autoplan.placements import REPLICATE
from autoplan.units import ms, nbytes

GAINS_LITTLE = 1.25
"""Below this predicted speed-up over one device, the plan gains little from the mesh."""


def one_device_seconds(costed) -> float | None:
    """The whole step on one device, priced by the cost stage (``CostedGraph``): each op's
    least compute among its all-replicated strategies (weighted as ``predict`` weights a
    tied layer). None where an op has no all-replicated strategy. A strategy names no
    layout (None) for an output that is no tensor."""
    graph = costed.choices.graph
    total = 0.0
    for name, cost in costed.nodes.items():
        whole = [
            i for i, strategy in enumerate(graph.decision(name).strategies)
            if all(p == REPLICATE for spec in (*strategy.inputs, *strategy.outputs) if spec is not None for p in spec)
        ]
        if not whole:
            return None
        total += min(cost.compute_s[i] for i in whole)
    return total


def gain_lines(s) -> tuple[str, ...]:
    """The "what the mesh gains" notes of a ``show.Summary``: why a replicated plan is the
    answer; the speed-up where one device's step is known, with why when it is small."""
    if s.all_replicated:
        return (nothing_gained(s),)
    if s.one_device_s is None or s.step_time_s <= 0:
        return ()
    speedup = s.one_device_s / s.step_time_s
    line = (f"predicted speed-up over one device {speedup:.2f}x on {_devices(s)} devices "
            f"(one device runs the whole step in {ms(s.one_device_s)} ms)")
    if speedup >= GAINS_LITTLE:
        return (line,)
    return (f"{line}: the mesh gains little. {_little_gained(s)}",)


def nothing_gained(s) -> str:
    """Why a plan that replicates everything is still the answer, in words."""
    m = s.memory
    # as large as the parameters (the split at the peak may hold none yet: ``cost/memory.py``)
    grads = f" a data-parallel step would all-reduce {nbytes(m.parameters)} of gradients each step;" if m.parameters else ""
    fits = "fits the budget" if m.budget and m.peak <= m.budget else "is what it is"
    return (
        f"every parameter and the batch are replicated: all {_devices(s)} devices compute the same whole step, "
        f"so the predicted speed-up over one device is 1.0x. Why: the solver found no faster layout;{_fixed_cost(s)}"
        f"{grads} splitting saves less than the communication it adds, and the peak {nbytes(m.peak)} {fits}, "
        f"so nothing forces sharding. A larger model or batch is where the mesh pays."
    )


def _little_gained(s) -> str:
    saved = s.one_device_s - s.compute_s
    if saved > 0:
        split = (f"splitting the work over the mesh saves {ms(saved)} ms of one device's {ms(s.one_device_s)} ms "
                 f"of compute and adds {ms(s.comm_s)} ms of communication;")
    else:  # a budget that forces sharding can make the split step no faster than one device
        split = (f"split over the mesh, the compute takes {ms(s.compute_s)} ms, no less than one device's "
                 f"{ms(s.one_device_s)} ms, and communication adds {ms(s.comm_s)} ms;")
    return (f"Why: {split}{_fixed_cost(s)} the solver found no layout that gains more. "
            f"A larger model or batch is where the mesh pays.")


def _fixed_cost(s) -> str:
    """How little of the compute is the model's arithmetic (where MFU is known)."""
    if s.mfu is None:
        return ""
    # model FLOPs at one device's peak: the part of the compute that splitting could shrink
    ideal = s.mfu * s.step_time_s * _devices(s)
    return (f" of its {ms(s.compute_s)} ms of compute, the model's FLOPs at one device's peak take "
            f"{ms(ideal)} ms: the rest is {_rest_of_compute(s)};")


def _rest_of_compute(s) -> str:
    """What the compute is beside the model's FLOPs: the plan's two largest compute parts
    (``mfu.py``'s split), or, for a plan written before plans split their compute, the
    fixed per-op cost it mostly is at these sizes."""
    parts = sorted(((s.compute_split[key], words.split(" (")[0]) for key, words in COMPUTE_ROWS if s.compute_split),
                   reverse=True)[:2]
    if not parts or parts[0][0] <= 0:
        return "fixed per-op cost, which every device pays whatever the split"
    named = " and ".join(f"{words} ({ms(seconds)} ms)" for seconds, words in parts if seconds > 0)
    return f"mostly {named}, as the split under \"model FLOPs utilisation\" shows"


def _devices(s) -> int:
    devices = 1
    for size in s.mesh:
        devices *= size
    return devices
