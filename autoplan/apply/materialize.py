"""Deferred initialisation: a model built on the meta device gets only its local shards.

``apply_plan(model, plan, mesh, init=...)`` on a meta model allocates, on each rank, just
the shard of every parameter that the plan gives it (``empty_shard``) and whole copies of
the buffers (autoplan keeps buffers replicated), then fills them with ``init``:

- ``"reset_parameters"``: each module's own ``reset_parameters()`` (torch's layers have
  one); a module with meta-born state and no such method is an error naming it;
- a callable ``init(module)``, called once per module that had meta-born state, inner
  modules first, under ``torch.no_grad()``: HuggingFace's ``model._init_weights`` has that
  signature and also recomputes non-persistent buffers (rotary tables).

Random initialisers draw per shard, so values differ from a single-device build; load the
real weights afterwards with ``load_full_state_dict`` (a full, unsharded state dict, the
same on every rank) or, for a sharded checkpoint from ``save_checkpoint`` (saved under any
plan), with ``load_checkpoint`` (``interop/checkpoint.py``), which fills the DTensor shards and
the optimizer's state in place.

Parameters are created once, materialised, before ``apply_plan`` registers its gradient
hooks; and everything here writes into the existing tensors. Calling ``model.to_empty()``
after ``apply_plan`` instead would replace the DTensor parameters and silently drop the
gradient hooks that reduce gradients to the plan's placements.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autoplan.errors import PlanError

INIT_HINT = (
    'pass init="reset_parameters" (torch layers), init=model._init_weights (HuggingFace) or your own '
    "init(module) to apply_plan, or build the model on a real device"
)


def empty_shard(like: torch.Tensor, mesh: DeviceMesh, placements) -> DTensor:
    """An uninitialised DTensor of ``like``'s global shape whose local tensor is this rank's shard only."""
    shape, _ = compute_local_shape_and_global_offset(like.shape, mesh, placements)
    local = torch.empty(shape, dtype=like.dtype, device=mesh.device_type)
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=like.shape, stride=_contiguous_stride(like.shape))


def materialize_buffers(model: nn.Module, mesh: DeviceMesh) -> set[str]:
    """Allocate every meta buffer whole on the mesh's device; returns the owning module FQNs."""
    owners = set()
    for fqn, module in model.named_modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=mesh.device_type)
                owners.add(fqn)
    return owners


def initialize(model: nn.Module, owners: set[str], init) -> None:
    """Fill the state of the modules in ``owners`` (those that had meta state) with ``init``."""
    if not owners:
        return
    if init is None:
        raise PlanError(f"the model is on the meta device ({len(owners)} modules, e.g. {sorted(owners)[0] or '<root>'})", hint=INIT_HINT)
    modules = dict(model.named_modules())
    ordered = sorted(owners, key=lambda fqn: -fqn.count("."))  # inner modules first
    with torch.no_grad():
        if init == "reset_parameters":
            lacking = [fqn or "<root>" for fqn in ordered if not callable(getattr(modules[fqn], "reset_parameters", None))]
            if lacking:
                raise PlanError(
                    f"modules with meta state have no reset_parameters(): {lacking[:3]}",
                    hint="pass init=your_init(module) that initialises them (HuggingFace: init=model._init_weights)",
                )
            for fqn in ordered:
                modules[fqn].reset_parameters()
        elif callable(init):
            for fqn in ordered:
                init(modules[fqn])
        else:
            raise PlanError(f'expected init to be "reset_parameters" or a callable, got {init!r}', hint=INIT_HINT)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Copy a full (unsharded) state dict into the model in place, each rank taking its shard.

    Works on a model from ``apply_plan`` (DTensor parameters) and on a plain one. The
    tensors are written into, never replaced, so ``apply_plan``'s hooks stay attached.
    """
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if strict and (missing or unexpected):
        raise PlanError(
            f"the state dict does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})",
            hint="save it from the same model class and config, or pass strict=False",
        )
    with torch.no_grad():
        for name, target in own.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            if tuple(value.shape) != tuple(target.shape):
                raise PlanError(f"{name}: expected shape {list(target.shape)}, got {list(value.shape)}",
                    hint="load a state dict of this model's config")
            if isinstance(target, DTensor):
                shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
                index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
                target.to_local().copy_(value[index])
            else:
                target.copy_(value)


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(tuple(shape)):
        stride.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(stride))

