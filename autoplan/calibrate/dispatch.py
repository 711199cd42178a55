"""Fixed costs of running a plan eagerly through DTensor: per op, per backward, per optimizer step.

A plan runs every op of the model as a DTensor op: before the local kernel, DTensor
propagates shardings (cached per op schema), plans any redistribute, and wraps the local
result; autograd records the op and, in the backward, runs its derivative ops the same
way; ``AdamW.step()`` then runs about ten DTensor ops per parameter. On a GPU all of this
is host-side time that the device waits through whenever kernels are short; on CPU ranks
sharing cores it adds to every op. ``kernel_overhead_s`` (a plain one-element add) misses
it, so it is measured here, on the calibrated mesh and on every rank at once, the way a
step runs it:

    figure                what is timed (tiny tensors: fixed cost only)
    forward_op_s          a chain of DTensor ops (mm, two views, mul, add per block),
                          leaves requiring grad so that autograd records as in training,
                          under the apply engine's ``plan_execution``; time per op
    backward_op_s         the same chain's backward, timed itself after each forward
                          (``Timer.seconds_of_parts``); time per forward op (its
                          derivative ops, the autograd engine)
    optimizer             AdamW.step() over DTensor parameters of several sizes: fixed
                          time per parameter and local bytes updated per second (a line fit)
    op_classes            forward and backward of representative ops of each op class
                          (``dispatch_classes.py``); the chain's figures price the ops of
                          no class

Activations are split on the first mesh axis and parameters replicated (a data-parallel
layout), so no op needs a collective: communication is priced by the collective fits.
The op points (chain and op classes) run about ``sweep.dispatch_target_s`` per repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.apply.engine import plan_execution
from autoplan.calibrate.dispatch_classes import OpClassSample, count_op_class_points, measure_op_classes
from autoplan.calibrate.progress import Progress
from autoplan.calibrate.timing import Timer

CHAIN_BLOCKS = 8
"""Blocks in the timed op chain; each block is OPS_PER_BLOCK forward ops."""
OPS_PER_BLOCK = 5
"""mm, view, view, mul, add."""
TINY = 8
"""Local rows and columns of the chain's tensors: small enough that kernels take no time."""
OPTIMIZER_PARAMS = 8
"""Parameters per timed AdamW step (the time is divided by it)."""


@dataclass(frozen=True, slots=True)
class OptimizerSample:
    """One AdamW step over ``OPTIMIZER_PARAMS`` DTensor parameters of one size."""

    elements: int
    """Local elements per parameter."""
    nbytes: int
    """Local bytes per parameter (float32)."""
    seconds: float
    """Time per parameter."""


@dataclass(frozen=True, slots=True)
class DispatchSample:
    """The fixed per-op times of eager DTensor execution on one mesh."""

    forward_op_s: float
    """Time of one forward DTensor op (tiny), autograd recording included."""
    backward_op_s: float
    """Backward time per forward op of the chain."""
    optimizer: tuple[OptimizerSample, ...]
    op_classes: tuple[OpClassSample, ...] = ()
    """Per representative op of each op class: its forward and backward fixed times."""


def count_dispatch_points(optimizer_elements: tuple[int, ...]) -> int:
    return 2 + len(optimizer_elements) + count_op_class_points()


def measure_dispatch(mesh: DeviceMesh, optimizer_elements: tuple[int, ...], timer: Timer, progress: Progress) -> DispatchSample:
    """Every rank measures the same points at once; every rank returns the same figures."""
    forward, backward = _chain(mesh)
    ops = CHAIN_BLOCKS * OPS_PER_BLOCK
    op_timer = replace(timer, sweep=replace(timer.sweep, target_s=timer.sweep.dispatch_target_s))
    with torch.enable_grad():
        forward_s, backward_s = op_timer.seconds_of_parts(forward, backward)
        progress.step("DTensor op, forward")
        progress.step("DTensor op, forward + backward")
    samples = []
    for elements in optimizer_elements:
        seconds = timer.seconds(_optimizer_step(mesh, elements)) / OPTIMIZER_PARAMS
        itemsize = torch.finfo(torch.float32).bits // 8
        samples.append(OptimizerSample(elements, elements * itemsize, seconds))
        progress.step(f"AdamW step, {elements} elements per parameter")
    op_classes = measure_op_classes(mesh, op_timer, progress)
    return DispatchSample(forward_s / ops, backward_s / ops, tuple(samples), op_classes)


def _activation_placements(mesh: DeviceMesh) -> list:
    return [Shard(0)] + [Replicate()] * (mesh.ndim - 1)


def _chain(mesh: DeviceMesh):
    """(forward, backward of what the forward made) closures over one chain of tiny DTensor ops."""
    device = mesh.device_type
    replicated = [Replicate()] * mesh.ndim
    x = DTensor.from_local(torch.ones(TINY, TINY, device=device), mesh, _activation_placements(mesh), run_check=False)
    x.requires_grad_()
    weight = DTensor.from_local(torch.full((TINY, TINY), 0.01, device=device), mesh, replicated, run_check=False)
    weight.requires_grad_()
    scale = DTensor.from_local(torch.ones(TINY, device=device), mesh, replicated, run_check=False)
    scale.requires_grad_()
    rows = x.shape[0]
    # The chain's output gradient, in the output's own layout: a gradient from ``sum()``
    # would arrive replicated and make every backward op redistribute it first.
    seed = DTensor.from_local(torch.ones(TINY, TINY, device=device), mesh, _activation_placements(mesh), run_check=False)

    def forward():
        h = x
        with plan_execution(mesh):  # as a planned model's forward runs
            for _ in range(CHAIN_BLOCKS):
                y = torch.mm(h, weight).view(rows, 2, TINY // 2).view(rows, TINY)
                h = y * scale + h
        return h

    def backward(h):
        h.backward(seed)
        for leaf in (x, weight, scale):
            leaf.grad = None

    return forward, backward


def _optimizer_step(mesh: DeviceMesh, elements: int):
    """One ``AdamW.step()`` over OPTIMIZER_PARAMS replicated DTensor parameters with gradients."""
    device = mesh.device_type
    replicated = [Replicate()] * mesh.ndim
    params = []
    for _ in range(OPTIMIZER_PARAMS):
        param = torch.nn.Parameter(DTensor.from_local(torch.zeros(elements, device=device), mesh, replicated, run_check=False))
        param.grad = DTensor.from_local(torch.full((elements,), 1e-3, device=device), mesh, replicated, run_check=False)
        params.append(param)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    return optimizer.step
