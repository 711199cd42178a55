"""Fixed cost of one traced op per op class (``autoplan/cost/op_classes.py``), as DTensor runs it.

For each class a few representative ATen ops (those the traced zoo models use most) are
called on tiny DTensors on the calibrated mesh, every rank at once, the way a training
step runs them: through the call a model makes (``F.layer_norm``, ``x.view``), under the
apply engine's ``plan_execution`` context like a planned model's forward; inputs that
stand for activations carry a gradient and are not leaves (so the backward stops at them,
as it hands their gradient on in a model), parameters are leaves requiring grad. Per
representative op:

    forward_s     ``INSTANCES`` independent calls of the op, time per call: the apply
                  engine's torch-function mode, dispatch, sharding propagation, wrapping,
                  autograd recording, the tiny kernel
    backward_s    the same calls then ``torch.autograd.grad`` of every call's output
                  (seeded in the output's own layout) with respect to its inputs, minus
                  the forward; per call: the op's derivative ops and the autograd engine

A class's figures are the mean over its representatives (``class_figures``). The calls
are independent, not chained, so that no gradient is accumulated into a shared input:
the figure is one op's own cost. Activations are split on the first mesh axis and
parameters replicated where DTensor keeps that layout without communicating; ops that
would communicate on it (a batch norm's statistics over the batch, a loss's mean over
the batch) get replicated inputs. Each op is checked once under ``CommDebugMode``: a
collective in what is timed would be priced twice (the collective fits price it). An op
DTensor cannot run, forward or backward, on the device or torch at hand (on CUDA batch
norm runs as ``cudnn_batch_norm``, which has no DTensor rule) is skipped, and left out of
the raw timings; the other ops of its class price it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

from autoplan.apply.engine import plan_execution
from autoplan.calibrate.progress import Progress
from autoplan.calibrate.timing import Timer
from autoplan.cost.op_classes import OP_CLASSES, op_class

aten = torch.ops.aten
INSTANCES = 8
"""Independent calls per timed closure (the time is divided by it)."""
TINY = 8
"""Size of every tensor dimension: small enough that kernels take no time."""


@dataclass(frozen=True, slots=True)
class OpClassSample:
    """One representative op's fixed costs on the mesh."""

    op_class: str
    """Its class (``op_classes.OP_CLASSES``)."""
    op: str
    """The ATen overload, e.g. "aten.mm.default"."""
    forward_s: float
    """Time of one forward call."""
    backward_s: float
    """Backward time of one call (its derivative ops and the engine's work)."""


class _Inputs:
    """Tiny DTensor inputs on one mesh."""

    def __init__(self, mesh: DeviceMesh, replicated: bool):
        self.mesh = mesh
        self.device = mesh.device_type
        rest = [Replicate()] * (mesh.ndim - 1)
        self.replicate = [Replicate()] * mesh.ndim
        self.split = self.replicate if replicated else [Shard(0)] + rest
        self.rows = TINY * (1 if replicated else mesh.shape[0])
        """Global length of an activation's first dim (shapes passed to views are global)."""

    def activation(self, *shape: int) -> DTensor:
        """A value with a gradient that is not a leaf: the backward hands its gradient on and stops."""
        leaf = DTensor.from_local(torch.rand(*shape, device=self.device), self.mesh, self.split, run_check=False)
        return leaf.requires_grad_() * 1.0  # type: ignore[return-value]  # typed Tensor, a DTensor at run time

    def parameter(self, *shape: int) -> DTensor:
        local = torch.rand(*shape, device=self.device)
        return DTensor.from_local(local, self.mesh, self.replicate, run_check=False).requires_grad_()  # type: ignore[return-value]  # as above

    def indices(self, high: int, *shape: int) -> DTensor:
        local = torch.randint(0, high, shape, device=self.device)
        return DTensor.from_local(local, self.mesh, self.split, run_check=False)


@dataclass(frozen=True, slots=True)
class _Case:
    op: object
    """The ATen overload the call runs (one traced op of its class)."""
    call: Callable[..., object]
    """The call a model makes (``torch.mm``, ``F.layer_norm``) on the inputs ``make`` built."""
    make: Callable[[_Inputs], tuple]
    replicated: bool = False
    """Replicated inputs: the split layout would make DTensor communicate."""


T = TINY
_CASES: tuple[_Case, ...] = (
    _Case(aten.view.default, lambda x, rows: x.view(rows, 2, T // 2), lambda i: (i.activation(T, T), i.rows)),
    _Case(aten._unsafe_view.default, lambda x, rows: x.reshape(rows, T * T), lambda i: (i.activation(T, T, T), i.rows)),
    _Case(aten.t.default, torch.t, lambda i: (i.activation(T, T),)),
    _Case(aten.transpose.int, lambda x: x.transpose(1, 2), lambda i: (i.activation(T, T, T),)),
    _Case(aten.expand.default, lambda x, rows: x.expand(rows, 4, T), lambda i: (i.activation(T, 1, T), i.rows)),
    _Case(aten.unsqueeze.default, lambda x: x.unsqueeze(1), lambda i: (i.activation(T, T),)),
    _Case(aten.slice.Tensor, lambda x: x[:, : T // 2], lambda i: (i.activation(T, T),)),
    _Case(aten.add.Tensor, torch.add, lambda i: (i.activation(T, T), i.activation(T, T))),
    _Case(aten.mul.Tensor, torch.mul, lambda i: (i.activation(T, T), i.parameter(T))),
    _Case(aten.mul.Scalar, lambda x: x * 0.5, lambda i: (i.activation(T, T),)),
    _Case(aten.gelu.default, F.gelu, lambda i: (i.activation(T, T),)),
    _Case(aten.rsqrt.default, torch.rsqrt, lambda i: (i.activation(T, T),)),
    _Case(aten.clone.default, torch.clone, lambda i: (i.activation(T, T),)),
    _Case(aten.mm.default, torch.mm, lambda i: (i.activation(T, T), i.parameter(T, T))),
    _Case(aten.addmm.default, torch.addmm, lambda i: (i.parameter(T), i.activation(T, T), i.parameter(T, T))),
    _Case(aten.bmm.default, torch.bmm, lambda i: (i.activation(T, T, T), i.activation(T, T, T))),
    _Case(aten.mean.dim, lambda x: x.mean(-1, keepdim=True), lambda i: (i.activation(T, T),)),
    _Case(aten.sum.dim_IntList, lambda x: x.sum(-1), lambda i: (i.activation(T, T),)),
    _Case(aten._softmax.default, lambda x: F.softmax(x, -1), lambda i: (i.activation(T, T),)),
    _Case(aten._log_softmax.default, lambda x: F.log_softmax(x, -1), lambda i: (i.activation(T, T),)),
    _Case(aten.native_layer_norm.default, lambda x, w, b: F.layer_norm(x, (T,), w, b),
          lambda i: (i.activation(T, T), i.parameter(T), i.parameter(T))),
    _Case(aten.native_batch_norm.default, lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
          lambda i: (i.activation(T, 2, 4, 4), i.parameter(2), i.parameter(2)), replicated=True),
    _Case(aten.embedding.default, lambda w, index: F.embedding(index, w), lambda i: (i.parameter(T, T), i.indices(T, T))),
    _Case(aten.nll_loss_forward.default, F.nll_loss, lambda i: (i.activation(T, T), i.indices(T, T)), replicated=True),
    _Case(aten.convolution.default, lambda x, w, b: F.conv2d(x, w, b, padding=1),
          lambda i: (i.activation(T, 2, 4, 4), i.parameter(2, 2, 3, 3), i.parameter(2))),
    _Case(aten.cat.default, lambda a, b: torch.cat([a, b], -1), lambda i: (i.activation(T, T), i.activation(T, T))),
    _Case(aten.topk.default, lambda x: torch.topk(x, 2, -1), lambda i: (i.activation(T, T),)),
    _Case(aten.gather.default, lambda x, index: torch.gather(x, -1, index),
          lambda i: (i.activation(T, T), i.indices(T, T, 2)), replicated=True),
)


def count_op_class_points() -> int:
    return len(_CASES)


def measure_op_classes(mesh: DeviceMesh, timer: Timer, progress: Progress) -> tuple[OpClassSample, ...]:
    """Every rank times the same ops at once; every rank returns the same figures."""
    samples = []
    with torch.enable_grad():
        for case in _CASES:
            try:
                forward, backward = _closures(case, mesh)
            except (NotImplementedError, RuntimeError) as err:
                # DTensor cannot run the op, or its backward, on this device or torch (on
                # CUDA batch norm runs as cudnn_batch_norm, which has no DTensor rule): the
                # other ops of its class price it.
                if not isinstance(err, NotImplementedError) and "DTensor" not in str(err):
                    raise  # NotImplementedError is a RuntimeError too
                progress.step(f"DTensor {case.op}: DTensor cannot run it here, skipped ({_first_line(err)})")
                continue
            forward_s, backward_s = timer.seconds_of_parts(forward, backward)
            sample = OpClassSample(op_class(case.op), str(case.op), forward_s / INSTANCES, backward_s / INSTANCES)
            samples.append(sample)
            progress.step(f"DTensor {case.op}, forward and backward")
    return tuple(samples)


def class_figures(samples: tuple[OpClassSample, ...]) -> dict[str, tuple[float, float]]:
    """Per class measured: (forward_s, backward_s), the mean over its representative ops."""
    figures = {}
    for name in OP_CLASSES:
        members = [s for s in samples if s.op_class == name]
        if members:
            figures[name] = (statistics.fmean(s.forward_s for s in members), statistics.fmean(s.backward_s for s in members))
    return figures


def _closures(case: _Case, mesh: DeviceMesh):
    """(forward, backward of what the forward made) closures over ``INSTANCES`` independent
    calls of the case's op."""
    inputs = _Inputs(mesh, case.replicated)
    calls = [case.make(inputs) for _ in range(INSTANCES)]
    needs_grad = [x for args in calls for x in args if isinstance(x, torch.Tensor) and x.requires_grad]

    def forward():
        with plan_execution(mesh):
            return [_first(case.call(*args)) for args in calls]

    with CommDebugMode() as comm:
        outputs = forward()
        seeds = [torch.ones_like(out) for out in outputs]  # the output's own layout: no redistribute
        torch.autograd.grad(outputs, needs_grad, seeds, allow_unused=True)
    if comm.get_total_counts():
        raise RuntimeError(f"calibrating {case.op} on mesh {tuple(mesh.shape)} communicated: {comm.get_comm_counts()}")

    def backward(outputs):
        torch.autograd.grad(outputs, needs_grad, seeds, allow_unused=True)

    return forward, backward


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:120]


def _first(output):
    """The output a model's next op reads (a layer norm's normalized value, topk's values)."""
    return output[0] if isinstance(output, (tuple, list)) else output
