"""Numerical check of plans: run them on gloo processes and compare with one device.

For each job (a model file, its builder and a plan) every rank builds the model with the
same seed, keeps an untouched copy as the single-device reference, applies the plan,
feeds its slice of the same global batch, and runs forward and backward; both models do
the same on the reference side, with dropout the identity on both (``WithoutRandomness``).
The loss is the model file's ``compute_loss`` where it defines one (each rank imports the
file by its path, so nothing is pickled), else the model's own (``trace/loss.py``).
Rank 0 reports the relative error of the loss, of every parameter gradient
(``max|g - g_ref| / max|g_ref|``) and of every floating buffer after the step
(BatchNorm's running statistics, updated in place). A gradient far below the
model's largest (``ZERO_GRADIENT_FLOOR``) is judged against that floor instead of its
own size: such gradients are zero in exact arithmetic and hold only rounding noise. And
no gradient is asked to be closer to one device's than one device's is to the exact one:
the reference runs a second time in float64, and where the float32 reference is itself off
from it by more than ``ROUNDING_SHARE`` of the scale above (a conv bias under BatchNorm,
zero in exact arithmetic, summed from 32768 terms in float32), the scale becomes that
error over ``ROUNDING_SHARE``, so the error reported reaches ``ROUNDING_SHARE`` just
where the plan's gradient is as far from one device's as one device's is from float64.
Where the float64 gradient itself is no larger than that error (zero in exact arithmetic:
a bias whose gradient a following GroupNorm cancels), both float32 results are rounding
alone and may differ by both roundings: the scale is ``INDEPENDENT_ROUNDINGS`` times it.
The worst error is named (``NumericsResult.worst_name``).
A model with an op that has no float64 kernel (a mixture of experts' ``_grouped_mm``) is
judged by size and floor alone.

A plan with pipeline stages runs on its full mesh (``compare_pipelined``): each rank
compares the gradients of its stages' parameters, and also counts its step's collectives
and point-to-point ops (``NumericsResult.counts``, ``verify/pipeline_counts.py``).

All jobs run in one launch of ``world`` processes on 127.0.0.1, since starting the
processes (importing torch) costs far more than a small model's step. Used by the tests,
``benchmarks/zoo.py`` and, later, ``autoplan verify --numerics``.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from autoplan._process_group import free_port
from autoplan._processes import model_file_modules, start_ranks
from autoplan.dtensor.fused_attention import sdpa_call
from autoplan.model_file import model_call_kwargs
from autoplan.trace.loss import model_loss

COLLECTIVE_TIMEOUT_S = 300
ZERO_GRADIENT_FLOOR = 1e-4
"""Gradients smaller than this fraction of the model's largest are judged against that size."""
ROUNDING_SHARE = 1e-5
"""The tolerance the checks hold gradients to (``tests/integration/zoo/test_zoo_numerics.py``); see the docstring."""
INDEPENDENT_ROUNDINGS = 2
"""For a gradient that is zero in exact arithmetic: how many roundings of one device's size
the plan's result may differ from one device's by (its own and one device's)."""


@dataclass(frozen=True)
class NumericsJob:
    model_file: str
    builder: str
    plan_json: str


@dataclass(frozen=True)
class NumericsResult:
    loss: float
    """Relative error of the loss."""
    gradients: dict[str, float] = field(default_factory=dict)
    buffers: dict[str, float] = field(default_factory=dict)
    reference_loss: float = math.nan
    """The single-device model's loss: which loss both sides computed (``compute_loss``'s or the model's own)."""
    counts: list = field(default_factory=list)
    """For a pipelined plan: per rank, the collectives and point-to-point ops its step ran
    (module -> axis -> kind -> {"count", "bytes"}, ``verify/pipeline_counts.py``)."""

    @property
    def worst(self) -> float:
        return max([self.loss, *self.gradients.values(), *self.buffers.values()])

    @property
    def worst_name(self) -> str:
        """What ``worst`` was measured on: "loss", a parameter's gradient or a buffer, by name."""
        named = [("loss", self.loss), *((f"gradient of {k}", v) for k, v in self.gradients.items()),
                 *((f"buffer {k}", v) for k, v in self.buffers.items())]
        return max(named, key=lambda item: item[1])[0]


def check_numerics(jobs: list[NumericsJob], world: int, seed: int = 0) -> list[NumericsResult]:
    """Run every job on ``world`` gloo processes; one result per job, in order."""
    with tempfile.TemporaryDirectory(prefix="autoplan-numerics-") as tmp:
        out = Path(tmp) / "results.json"
        preload = tuple(dict.fromkeys(m for job in jobs for m in model_file_modules(job.model_file)))
        start_ranks(_worker, (world, free_port(), jobs, seed, str(out), os.getpid()), nprocs=world, preload=preload)
        raw = json.loads(out.read_text())
    return [NumericsResult(**item) for item in raw]


def _worker(rank: int, world: int, port: int, jobs: list[NumericsJob], seed: int, out_path: str, launcher_pid: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan._process_group import process_group
    from autoplan._processes import die_with_parent

    die_with_parent(launcher_pid)  # a killed `autoplan verify` takes its gloo ranks with it
    import autoplan
    from autoplan.model_file import import_model_file, loss_function

    torch.set_num_threads(1)  # many processes share few cores
    results = []
    with process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    ):
        for job in jobs:
            # A job that fails on one rank leaves the others blocked in a collective, so
            # errors are not caught here: the launch fails and names the job.
            try:
                plan = autoplan.Plan.from_dict(json.loads(job.plan_json))
                module = import_model_file(Path(job.model_file))
                loss_fn = loss_function(module, Path(job.model_file))
                if plan.pipeline is not None:
                    results.append(compare_pipelined(module, job.builder, plan, full_mesh(plan), seed, loss_fn))
                    continue
                mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
                results.append(_compare(module, job.builder, plan, mesh, seed, loss_fn))
            except Exception as err:
                raise RuntimeError(f"numerics job {job.model_file}:{job.builder} failed on rank {rank}") from err
    if rank == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f)
        os.replace(tmp, out_path)


def call_model(model, batch, loss_fn=None):
    """``model(**batch)`` for a dict batch (without the keys only ``loss_fn`` reads: a
    model not applied with it takes no argument for them), ``model(*batch)`` for a tuple."""
    return model(**model_call_kwargs(batch, loss_fn)) if isinstance(batch, dict) else model(*batch)


def build_seeded(module, builder: str, seed: int):
    """The model file's model, its weights drawn from ``seed``: the same on every process."""
    torch.manual_seed(seed)
    return getattr(module, builder)()


def seeded_batch(module, seed: int):
    """The model file's ``example_inputs()`` drawn from ``seed``, as a dict or a tuple."""
    torch.manual_seed(seed)
    batch = module.example_inputs()
    return batch if isinstance(batch, (dict, tuple)) else (batch,) if isinstance(batch, torch.Tensor) else tuple(batch)


def _compare(module, builder: str, plan, mesh, seed: int, loss_fn=None) -> dict:
    import autoplan

    model = build_seeded(module, builder, seed)
    reference = copy.deepcopy(model)
    batch = seeded_batch(module, seed + 1)

    exact = _in_float64(reference)
    autoplan.apply_plan(model, plan, mesh, loss_fn=loss_fn)
    with WithoutRandomness():
        # Applied with loss_fn, the model returns that loss itself.
        loss = autoplan.training_loss(call_model(model, autoplan.shard_batch(batch, plan, mesh)))
        loss.backward()
        ref_loss, exact = _reference_step(reference, exact, batch, loss_fn)
    gradients, buffers = _errors(model.named_parameters(), model.named_buffers(), reference, exact)
    return {
        "loss": abs(loss.item() - ref_loss.item()) / max(abs(ref_loss.item()), 1e-30),
        "gradients": gradients,
        "buffers": buffers,
        "reference_loss": ref_loss.item(),
    }


def _reference_step(reference, exact, batch, loss_fn):
    """One device's forward and backward, and its float64 twin's: (the loss, the float64
    model, or None where an op has no float64 kernel)."""
    ref_loss = model_loss(call_model(reference, batch, loss_fn), batch, loss_fn)
    ref_loss.backward()
    if exact is not None:
        batch64 = tree_map(lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x, batch)
        try:
            model_loss(call_model(exact, batch64, loss_fn), batch64, loss_fn).backward()
        except (RuntimeError, NotImplementedError):
            exact = None  # an op without a float64 kernel (grouped_mm): judged by size alone
    return ref_loss, exact


def _errors(named_parameters, named_buffers, reference, exact) -> tuple[dict, dict]:
    """The relative error of each parameter's gradient and floating buffer against the reference's."""
    exact_params = dict(exact.named_parameters()) if exact is not None else {}
    gradients = {}
    ref_params = dict(reference.named_parameters())
    # A gradient that is zero in exact arithmetic (a key bias under softmax) holds only
    # rounding noise; it is compared against a floor tied to the model's largest gradient.
    floor = ZERO_GRADIENT_FLOOR * max(
        (p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None), default=0.0
    )
    for fqn, param in named_parameters:
        ref = ref_params[fqn].grad
        if ref is None:
            continue
        grad = param.grad.full_tensor() if param.grad is not None else torch.zeros_like(ref)
        exact_grad = exact_params[fqn].grad if fqn in exact_params else None
        gradients[fqn] = gradient_error(grad, ref, exact_grad, floor)
    buffers = {}
    ref_buffers = dict(reference.named_buffers())
    for fqn, buffer in named_buffers:
        if buffer.is_floating_point():
            local = buffer.full_tensor() if hasattr(buffer, "full_tensor") else buffer
            buffers[fqn] = _relative(local, ref_buffers[fqn])
    return gradients, buffers


def full_mesh(plan):
    """The DeviceMesh a plan runs on: with its pipeline axis, where it has one."""
    from torch.distributed.device_mesh import init_device_mesh

    shape, names = (plan.mesh_shape, plan.axis_names) if plan.pipeline is None else \
        plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def compare_pipelined(module, builder: str, plan, mesh, seed: int, loss_fn=None) -> dict:
    """``_compare`` for a plan with pipeline stages, on its full mesh: every rank builds the
    whole model and its reference, applies the plan (keeping its stages), runs a step of the
    plan's schedule on the global batch (the second, counting its collectives and
    point-to-point ops: the first also exchanges shapes between stages) and compares the
    gradients of the parameters its stages hold. The ranks' findings are gathered: every
    parameter lies in one stage, and the loss is known on the ranks of the last stage."""
    import torch.distributed as dist

    import autoplan
    from autoplan.verify.pipeline_counts import counted_step

    model = build_seeded(module, builder, seed)
    reference = copy.deepcopy(model)
    batch = seeded_batch(module, seed + 1)
    exact = _in_float64(reference)
    pipelined = autoplan.apply_plan(model, plan, mesh, loss_fn=loss_fn)
    with WithoutRandomness():
        # The first step also agrees, stage to stage, on the shapes and layouts it sends:
        # the step counted and compared is the second, from fresh gradients.
        pipelined.step(batch)
        for param in pipelined.parameters():
            param.grad = None
        loss, counted = counted_step(pipelined, mesh, batch)
        ref_loss, exact = _reference_step(reference, exact, batch, loss_fn)
    gradients, buffers = _errors(pipelined.named_parameters(),
                                 (item for stage in pipelined.modules for item in stage.named_buffers()), reference, exact)
    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, (gradients, buffers, None if loss is None else loss.item(), counted))
    gradients = {fqn: max(rank[0].get(fqn, 0.0) for rank in found) for rank_found in found for fqn in rank_found[0]}
    buffers = {fqn: max(rank[1].get(fqn, 0.0) for rank in found) for rank_found in found for fqn in rank_found[1]}
    losses = [rank[2] for rank in found if rank[2] is not None]
    missing = sorted(fqn for fqn, p in reference.named_parameters() if p.grad is not None and fqn not in gradients)
    if missing:
        raise AssertionError(f"no stage holds the gradient of {missing[:3]}")
    return {
        "loss": max(abs(value - ref_loss.item()) for value in losses) / max(abs(ref_loss.item()), 1e-30),
        "gradients": gradients,
        "buffers": buffers,
        "reference_loss": ref_loss.item(),
        "counts": [rank[3] for rank in found],
    }


def gradient_error(grad: torch.Tensor, reference: torch.Tensor, exact: torch.Tensor | None, floor: float) -> float:
    """The relative error of the plan's ``grad`` against one device's ``reference``, on the
    scale the docstring above gives: the larger of the reference, ``floor`` and one device's
    rounding (its distance from ``exact``, the float64 gradient, over ``ROUNDING_SHARE``)."""
    scale = floor
    if exact is not None:
        rounding = (reference.double() - exact).abs().max().item()
        if exact.abs().max().item() <= rounding:
            # Zero in exact arithmetic (a bias under a GroupNorm that cancels it): one
            # device's result is its rounding alone, and so is the plan's, rounded
            # otherwise; the two differ by up to the sum of both roundings.
            rounding *= INDEPENDENT_ROUNDINGS
        scale = max(floor, rounding / ROUNDING_SHARE)
    return _relative(grad, reference, scale)


def _in_float64(model: torch.nn.Module):
    """A float64 copy of ``model`` (before any plan), the yardstick of one device's rounding;
    None where the model holds no float32 parameters to widen."""
    if not any(p.dtype == torch.float32 for p in model.parameters()):
        return None
    return copy.deepcopy(model).double()


def without_randomness() -> WithoutRandomness:
    """A context in which the model's randomness is off: dropout the identity, stochastic
    depth keeping every path (``WithoutRandomness``). ``--numerics`` and ``--compile`` run
    both sides of their comparison in it."""
    return WithoutRandomness()


class WithoutRandomness(TorchFunctionMode):
    """Dropout as the identity on both sides: its random masks differ between a rank's shard
    and the whole tensor by design, and are not what is compared (configs ship with
    dropout on, T5's at 0.1). Masks a model draws itself keep everything too: a uniform
    draw is just below one and a Bernoulli draw is one, so stochastic depth (Swin's
    ``keep_prob + torch.rand(...)``, floored) keeps every path, as its scaling by
    ``1 / keep_prob`` does on both sides alike. Everything else a training-mode forward
    does still runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DROPOUTS:
            return args[0]
        if func is F.scaled_dot_product_attention:  # its own dropout, on the attention weights
            return sdpa_call(args, kwargs)._replace(dropout_p=0.0).run()
        if func in _UNIFORM_DRAWS:
            drawn = func(*args, **kwargs)
            return drawn.fill_(1 - torch.finfo(drawn.dtype).eps)
        if func in _BERNOULLI_DRAWS:
            return func(*args, **kwargs).fill_(1)
        return func(*args, **kwargs)


_DROPOUTS = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout}
_UNIFORM_DRAWS = {torch.rand, torch.rand_like}
_BERNOULLI_DRAWS = {torch.bernoulli, torch.Tensor.bernoulli, torch.Tensor.bernoulli_}


def _relative(value: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    if reference.numel() == 0:
        return 0.0  # an empty buffer (a zero-width rotary table) holds nothing to differ
    scale = max(reference.abs().max().item(), floor)
    diff = (value.detach().float() - reference.detach().float()).abs().max().item()
    return diff / scale if scale > 0 else diff
