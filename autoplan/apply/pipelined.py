"""``apply_plan`` for a plan with pipeline stages: this rank's stages, their layout, the schedule.

On a mesh with the plan's pipeline axis (``PipelinePlan.full_mesh``), each rank keeps the
modules of its stage(s) (``apply/stages.py``; a copy of the model per stage where a rank
runs several), applies the plan's layout to each on the stage mesh (the full mesh less the
pipeline axis) with the engine, and wraps each in a ``torch.distributed.pipelining``
``PipelineStage`` over the pipeline axis's process group. ``Pipelined.step(batch)`` runs
the plan's schedule on the global batch, the same call on every rank.

The loss is autoplan's usual one (``trace/loss.py``: ``loss_fn`` where given, else the
model's own), computed inside the last stage's forward for each microbatch, under the
plan, as the mean over that microbatch. The schedule scales gradients by one over the
number of microbatches (``scale_grads``), so they are the gradients of the mean of the
microbatch losses: the whole batch's mean loss where every microbatch weighs the same
(as many tokens counted in each; a loss that ignores padding weighs microbatches
unevenly).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autoplan.apply.stages import keep_stage, stage_plan
from autoplan.errors import PlanError
from autoplan.model_file import loss_only_keys
from autoplan.placements import to_placements
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import PipelinePlan
from autoplan.trace.loss import find_loss, first_tensor, plain

TARGET_KEYS = ("labels",)
"""Batch keys the last stage alone gets, besides a ``LossWithInputs``'s: the targets a
HuggingFace model computes its own loss from (what its ``Trainer`` calls ``label_names``)."""


class StageModule(nn.Module):
    """One stage as ``PipelineStage`` runs it: the stage's share of the model (``model``,
    whose FQNs are the whole model's) called with the stage's input where the model's first
    input goes; returns the activation the next stage gets, or, on the last stage, the loss."""

    def __init__(self, model: nn.Module, index: int, first: bool, last: bool, targets: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.index, self.first, self.last, self.targets = index, first, last, targets
        self.input_key: str | None = None
        """The batch key of the model's first input (None: its first positional argument); set by ``Pipelined.step``."""

    def forward(self, activation, **kwargs):
        if not self.last:
            kwargs = {k: v for k, v in kwargs.items() if k not in self.targets}
        if not self.first and isinstance(activation, DTensor):
            activation = _GradientInLayout.apply(activation)
        output = self.model(activation, **kwargs) if self.input_key is None else self.model(**{self.input_key: activation}, **kwargs)
        if self.last:
            return _not_a_view(plain(output if isinstance(output, torch.Tensor) and output.dim() == 0 else find_loss(output).tensor))
        activation = first_tensor(output)
        if activation is None:
            raise PlanError(f"pipeline stage {self.index} returned no tensor to send to the next stage ({type(output).__name__})",
                            hint="cut the model where its forward hands a tensor on, or return one from the stage's last module")
        return _not_a_view(_unpartial(activation))


def _not_a_view(tensor: torch.Tensor) -> torch.Tensor:
    """A stage's output as a tensor of its own: the zero-bubble schedules detach it in place
    once its input gradients are taken, which a view (a head passed through, its logits a
    slice of the hidden states) refuses."""
    return tensor.clone() if tensor._is_view() else tensor


def _unpartial(tensor: torch.Tensor) -> torch.Tensor:
    """An activation sent to the next stage is laid out without a pending sum: its gradient
    comes back in the activation's own placements, which a partial one cannot take."""
    if isinstance(tensor, DTensor) and any(p.is_partial() for p in tensor.placements):
        return tensor.redistribute(tensor.device_mesh, [Replicate() if p.is_partial() else p for p in tensor.placements])
    return tensor


class _GradientInLayout(torch.autograd.Function):
    """The identity on a stage's received activation; its gradient, sent back to the previous
    stage as a local tensor in the activation's placements, is first brought there (a
    partial sum reduced)."""

    @staticmethod
    def forward(ctx, activation):
        ctx.placements = activation.placements
        return activation.view_as(activation)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(ctx.placements):
            grad = grad.redistribute(grad.device_mesh, ctx.placements)
        return grad


class Pipelined:
    """What the training loop calls for a plan with pipeline stages (``apply_plan``'s result).

    ``step(batch)``: one training step (forward and backward of every microbatch, as the
    schedule orders them) on the global batch, the same call on every rank; returns the
    batch's loss (the mean of the microbatch losses) on the ranks holding the last stage,
    None on the others. Then ``optimizer.step()`` over ``parameters()``."""

    def __init__(self, plan: Plan, stage_mesh: DeviceMesh, stages: list[StageModule], schedule, targets: tuple[str, ...]):
        self.plan, self.stage_mesh, self.schedule = plan, stage_mesh, schedule
        self.stages = stages
        self.modules = [stage.model for stage in stages]
        """This rank's stage models, in model order (the model's FQNs; for optimizers and checkpoints)."""
        self.first = any(stage.first for stage in stages)
        self.last = any(stage.last for stage in stages)
        self.targets = targets
        self.losses: list[torch.Tensor] = []
        """The last step's loss per microbatch (on the ranks holding the last stage)."""

    def parameters(self):
        for module in self.modules:
            yield from module.parameters()

    def named_parameters(self):
        for module in self.modules:
            yield from module.named_parameters()

    def checkpoint_view(self) -> nn.Module:
        """One module holding this rank's stage modules under their FQNs (plain containers
        above them): what ``save_checkpoint`` and ``load_checkpoint`` read and write, so a
        checkpoint saved under one cut into stages loads under another. What lies outside
        every stage (buffers of modules no stage names) is not in it."""
        view = nn.Module()
        pipeline = self.plan.pipeline
        assert pipeline is not None
        for stage in self.stages:
            for fqn in pipeline.stages[stage.index].modules:
                parent = view
                *path, name = fqn.split(".")
                for part in path:
                    if part not in parent._modules:
                        parent._modules[part] = nn.Module()
                    parent = parent.get_submodule(part)
                parent._modules[name] = stage.model.get_submodule(fqn)
        return view

    def step(self, batch) -> torch.Tensor | None:
        pipeline = self.plan.pipeline
        assert pipeline is not None
        input_key = _input_key(batch, self.targets)
        for stage in self.stages:
            stage.input_key = input_key
        args, kwargs = _microbatched(batch, self.plan, self.stage_mesh, pipeline.microbatches, input_key)
        self.losses = []
        target = torch.zeros(pipeline.microbatches) if self.last else None  # unread: the stage computes the loss
        self.schedule.step(*(args if self.first else ()), target=target, losses=self.losses, return_outputs=False, **kwargs)
        if not self.last:
            return None
        return torch.stack([loss.detach() for loss in self.losses]).mean()


def _schedule_loss(output, _target):
    """The schedule's loss function: the last stage's output is the microbatch's loss already."""
    return output


def apply_pipelined(model: nn.Module, plan: Plan, device_mesh: DeviceMesh, apply_layout, init=None, loss_fn=None) -> Pipelined:
    """The rank's stages of ``model`` under ``plan`` on ``device_mesh`` (the full mesh, with
    the pipeline axis); ``apply_layout(model, plan, mesh, init, loss_fn)`` is the engine's."""
    pipeline = plan.pipeline
    assert pipeline is not None
    _check_full_mesh(plan, pipeline, device_mesh)
    _check_stage_ranks(pipeline)
    pp_rank = device_mesh.get_local_rank(pipeline.axis)
    group = device_mesh.get_group(pipeline.axis)
    stage_mesh = device_mesh[plan.axis_names] if len(plan.axis_names) > 1 else device_mesh[plan.axis_names[0]]
    indices = pipeline.stages_of(pp_rank)
    copies = [model] + [copy.deepcopy(model) for _ in indices[1:]]  # before any stage is cut out of it
    last_index = len(pipeline.stages) - 1
    targets = tuple(dict.fromkeys((*TARGET_KEYS, *loss_only_keys(loss_fn))))
    device = _device_of(device_mesh)
    wrappers, stages = [], []
    for index, stage_model in zip(indices, copies):
        removed = keep_stage(stage_model, pipeline, index)
        apply_layout(stage_model, stage_plan(plan, stage_model, removed, index == 0, index == last_index), stage_mesh, init,
                     loss_fn if index == last_index else None)
        wrapper = StageModule(stage_model, index, index == 0, index == last_index, targets)
        wrappers.append(wrapper)
        stages.append(PipelineStage(wrapper, index, len(pipeline.stages), device, group=group,
                                    get_mesh=lambda names, layout: stage_mesh))
    schedule_class = get_schedule_class(pipeline.schedule)
    runs_several = issubclass(schedule_class, PipelineScheduleMulti)
    schedule = schedule_class(stages if runs_several else stages[0], pipeline.microbatches, loss_fn=_schedule_loss,
                              scale_grads=True)
    return Pipelined(plan, stage_mesh, wrappers, schedule, targets)


def _device_of(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, mesh.device_type)
    return torch.device(mesh.device_type, module.current_device())


def _input_key(batch, targets: tuple[str, ...]) -> str | None:
    """The batch key the first stage's input is (and the later stages' activation goes in
    place of): a dict batch's first key that is not a target; None for a tensor or
    one-tensor tuple batch, the model's first positional argument."""
    if not isinstance(batch, dict):
        return None
    for key in batch:
        if key not in targets:
            return key
    raise PlanError(f"the batch holds targets alone ({list(batch)})", hint="pass the model's inputs in the batch too")


def _check_full_mesh(plan: Plan, pipeline: PipelinePlan, mesh: DeviceMesh) -> None:
    shape, names = pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    if tuple(mesh.shape) != shape or tuple(mesh.mesh_dim_names or ()) != names:
        got = "x".join(map(str, mesh.shape))
        raise PlanError(
            f"the plan's pipeline runs on a {'x'.join(map(str, shape))} mesh with axes {list(names)}, "
                f"got a DeviceMesh of shape {got} with axes {list(mesh.mesh_dim_names or ())}",
            hint=f"build the DeviceMesh with init_device_mesh(device, {shape}, mesh_dim_names={names})",
        )


def _check_stage_ranks(pipeline: PipelinePlan) -> None:
    """Stages on the ranks the schedule puts them on: torch's schedules place stage i on
    pipeline rank i % size (looped), or, for ZBVZeroBubble, in a V (down the ranks, then
    back up); a plan that places them otherwise would send to ranks that do not expect it."""
    size = pipeline.size
    for index, stage in enumerate(pipeline.stages):
        if pipeline.schedule == "ZBVZeroBubble":
            expected = index if index < size else 2 * size - 1 - index
        else:
            expected = index % size
        if stage.rank != expected:
            raise PlanError(
                f"pipeline stage {index} is on pipeline rank {stage.rank}, but {pipeline.schedule} runs it on rank {expected}",
                hint="place stage i on rank i % size (on ZBVZeroBubble: i, then 2 * size - 1 - i), or re-plan",
            )


def _microbatched(batch, plan: Plan, mesh: DeviceMesh, microbatches: int, input_key: str | None):
    """The rank's share of the global ``batch``, as ``(args, kwargs)`` for the schedule's
    ``step``: each tensor cut into ``microbatches`` along dim 0, each microbatch sliced by
    the plan's batch layout (``plan.inputs``), the slices put back together along dim 0 (the
    schedule cuts them apart again)."""
    if isinstance(batch, dict):
        items = [(f"[1][{key!r}]", key, value) for key, value in batch.items()]
    else:
        batch = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
        if len(batch) != 1:
            raise PlanError(f"a pipelined step takes a dict batch or one tensor, got a tuple of {len(batch)}",
                            hint="pass the batch as a dict of the model's keyword arguments")
        items = [("[0][0]", None, batch[0])]
    local = {}
    for path, key, value in items:
        if isinstance(value, torch.Tensor):
            value = _local_microbatches(value, path, plan, mesh, microbatches)
        local[key] = value
    if input_key is None:
        return (local.pop(None),), {}
    first = local.pop(input_key)
    return (first,), local


def _local_microbatches(tensor: torch.Tensor, path: str, plan: Plan, mesh: DeviceMesh, microbatches: int) -> torch.Tensor:
    if tensor.dim() == 0 or tensor.shape[0] % microbatches:
        raise PlanError(
            f"batch input {path} has {tensor.shape[0] if tensor.dim() else 'no'} rows along dim 0, "
                f"which the plan's {microbatches} microbatches do not divide",
            hint="give every batch tensor the batch along dim 0, a multiple of the plan's microbatches",
        )
    layout = plan.inputs.get(path)
    if layout is None:
        return tensor
    placements = to_placements(layout.placements)
    pieces = []
    for micro in tensor.chunk(microbatches):
        shape, offset = compute_local_shape_and_global_offset(micro.shape, mesh, placements)
        pieces.append(micro[tuple(slice(o, o + n) for o, n in zip(offset, shape))])
    return torch.cat(pieces).contiguous()
