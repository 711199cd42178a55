"""Gradients for the parts of a split that the loss never reaches, laid out as the parts are.

Autograd runs a split's backward (``split``, ``chunk``, ``unbind``, ``tensor_split``) on
every part's gradient, and for a part the loss never read it makes zeros itself, from the
input's dtype and device only: a plain tensor, which DTensor's ``cat`` (``stack`` for
``unbind``) then refuses beside the DTensor gradients of the other parts ("got mixed
torch.Tensor and DTensor"). DTensor's implicit replication, which would take the zeros
as replicated, is the caller's thread-local setting in the backward, not the one the
forward ran under. CvT's last stage splits off its class token and never reads the rest.

``with_unreached_gradients`` hands a split's parts through an identity whose backward
gives each part the loss did not reach DTensor zeros in that part's own layout (no
communication), so that the split's own backward runs on DTensors only. torch already
forbids writing in place into the parts of a split that needs a gradient, so handing
them through a function changes nothing a model may do with them. Under ``torch.compile``
the split is left to torch: dynamo cannot keep the parts' layouts (their sizes are symbols
there).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

SPLITS = frozenset({
    torch.split, torch.Tensor.split, torch.Tensor.split_with_sizes, torch.chunk, torch.Tensor.chunk,
    torch.unbind, torch.Tensor.unbind, torch.tensor_split, torch.Tensor.tensor_split,
})


def with_unreached_gradients(func, parts):
    """``parts``, the result of the split ``func``, handed through ``_ZerosForUnreached``
    where they are DTensors that need a gradient; anything else as it is."""
    if func not in SPLITS or not torch.is_grad_enabled() or not isinstance(parts, (tuple, list)) or len(parts) < 2:
        return parts
    if torch.compiler.is_compiling():
        return parts
    if not all(isinstance(p, DTensor) and p.requires_grad for p in parts):
        return parts
    return type(parts)(_ZerosForUnreached.apply(*parts))


class _ZerosForUnreached(torch.autograd.Function):
    """The parts, unchanged (views of themselves); the backward hands a part no gradient
    reached DTensor zeros laid out as that part."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.set_materialize_grads(False)
        ctx.layouts = [layout_of(p) for p in parts]
        return tuple(p.view_as(p) for p in parts)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(grad if grad is not None else zeros_laid_out(layout) for grad, layout in zip(grads, ctx.layouts))


def layout_of(tensor: DTensor) -> tuple:
    """What ``zeros_laid_out`` needs to make zeros laid out as ``tensor``, kept without it."""
    local = tensor._local_tensor
    return local.shape, local.dtype, local.device, tensor._spec


def zeros_laid_out(layout: tuple) -> DTensor:
    """A DTensor of zeros in ``layout`` (``layout_of``): made shard by shard, no communication."""
    shape, dtype, device, spec = layout
    return DTensor(torch.zeros(shape, dtype=dtype, device=device), spec, requires_grad=False)
