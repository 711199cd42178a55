"""``as_strided`` that DTensor cannot express, run replicated where the step meets it.

DTensor answers ``aten.as_strided`` only where it changes nothing or permutes dims (its
custom op handler); anything else raises "as_strided not supported with DTensor". The
trace runs a module that restrides as an opaque region (``trace/opaque.py``), but
``torch.compile`` makes restrides the trace never saw: AOTAutograd regenerates an output
that aliases an input or an intermediate with ``as_strided`` (timm's Qwen3-ViT and
CPUBone compiled whole failed there).

Such a tensor is asked for a view of its whole storage, which a split DTensor does not
hold; gathered to replicated it does, and every rank takes the view of its whole copy.
``replicated_where_refused`` wraps DTensor's handler (``overrides.py`` installs it while a
plan runs): where DTensor refuses, the input is gathered and the view taken on it,
replicated, with a warning naming the op once (the plan's prediction does not count that
gather). Outside a planned step DTensor's refusal stands.
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.tensor import DTensor, Replicate

aten = torch.ops.aten

AS_STRIDED = aten.as_strided.default
_REFUSAL = "as_strided not supported with DTensor"
_warned: list[bool] = []


def replicated_where_refused(dtensor_handler, in_planned_step):
    """DTensor's ``as_strided`` handler, falling back to a view of the gathered input where
    it refuses, while ``in_planned_step()``."""

    def handler(op_call, args, kwargs):
        try:
            return dtensor_handler(op_call, args, kwargs)
        except RuntimeError as err:
            if _REFUSAL not in str(err) or not in_planned_step():
                raise
        tensor = args[0]
        mesh = tensor.device_mesh
        everywhere = (Replicate(),) * mesh.ndim
        whole = tensor.redistribute(mesh, everywhere) if tuple(tensor.placements) != everywhere else tensor
        local = whole._local_tensor
        if local.stride() != tensor.stride():  # the gathered copy laid out as the DTensor says it is
            local = torch.empty_strided(tensor.shape, tensor.stride(), dtype=local.dtype, device=local.device).copy_(local)
        view = op_call(local, *args[1:], **kwargs)
        if not _warned:
            _warned.append(True)
            warnings.warn(
                "autoplan: aten.as_strided asks a split DTensor for a view DTensor cannot express (the trace did "
                "not run it; torch.compile made it): it runs on the gathered tensor, replicated, which the plan's "
                "prediction does not count",
                stacklevel=2,
            )
        return DTensor.from_local(view, mesh, everywhere, run_check=False, shape=view.shape, stride=view.stride())

    return handler
