"""The numerics check (``verify/numerics.py``) of a plan with pipeline stages.

Every rank builds the whole model and its single-device reference as ``numerics`` does,
applies the plan on the full mesh (keeping its stages), runs one step of the plan's
schedule on the global batch and compares the gradients of the parameters its stages hold
with the reference's. The ranks' findings are gathered: every parameter lies in one stage,
and the loss is known on the ranks of the last stage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils._pytree import tree_map

from autoplan.trace.loss import model_loss


def full_mesh(plan) -> DeviceMesh:
    """The DeviceMesh a plan runs on: with its pipeline axis, where it has one."""
    shape, names = (plan.mesh_shape, plan.axis_names) if plan.pipeline is None else \
        plan.pipeline.full_mesh(plan.mesh_shape, plan.axis_names)
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def compare_pipelined(module, builder: str, plan, mesh: DeviceMesh, seed: int, loss_fn=None) -> dict:
    import autoplan
    from autoplan.verify import numerics

    model = numerics.build_seeded(module, builder, seed)
    reference = numerics.copy.deepcopy(model)
    batch = numerics.seeded_batch(module, seed + 1)
    exact = numerics._in_float64(reference)
    pipelined = autoplan.apply_plan(model, plan, mesh, loss_fn=loss_fn)
    with numerics.WithoutRandomness():
        loss = pipelined.step(batch)
        ref_loss = model_loss(numerics.call_model(reference, batch, loss_fn), batch, loss_fn)
        ref_loss.backward()
        if exact is not None:
            batch64 = tree_map(lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x, batch)
            try:
                model_loss(numerics.call_model(exact, batch64, loss_fn), batch64, loss_fn).backward()
            except (RuntimeError, NotImplementedError):
                exact = None
    exact_params = dict(exact.named_parameters()) if exact is not None else {}
    ref_params = dict(reference.named_parameters())
    floor = numerics.ZERO_GRADIENT_FLOOR * max(
        (p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None), default=0.0
    )
    gradients = {}
    for fqn, param in pipelined.named_parameters():
        ref = ref_params[fqn].grad
        if ref is None:
            continue
        grad = param.grad.full_tensor() if param.grad is not None else torch.zeros_like(ref)
        gradients[fqn] = numerics.gradient_error(grad, ref, exact_params[fqn].grad if fqn in exact_params else None, floor)
    ref_buffers = dict(reference.named_buffers())
    buffers = {}
    for stage_model in pipelined.modules:
        for fqn, buffer in stage_model.named_buffers():
            if buffer.is_floating_point():
                local = buffer.full_tensor() if hasattr(buffer, "full_tensor") else buffer
                buffers[fqn] = numerics._relative(local, ref_buffers[fqn])
    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, (gradients, buffers, None if loss is None else loss.item()))
    gradients = {fqn: max(rank[0].get(fqn, 0.0) for rank in found) for rank_found in found for fqn in rank_found[0]}
    buffers = {fqn: max(rank[1].get(fqn, 0.0) for rank in found) for rank_found in found for fqn in rank_found[1]}
    losses = [rank[2] for rank in found if rank[2] is not None]
    missing = sorted(set(ref_params) - set(gradients) - {f for f, p in ref_params.items() if p.grad is None})
    if missing:
        raise AssertionError(f"no stage holds the gradient of {missing[:3]}")
    return {
        "loss": max(abs(value - ref_loss.item()) for value in losses) / max(abs(ref_loss.item()), 1e-30),
        "gradients": gradients,
        "buffers": buffers,
        "reference_loss": ref_loss.item(),
    }
