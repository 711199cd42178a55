"""Trace ``scaled_dot_product_attention`` as the fused kernel a device runs, not as its math.

On meta tensors PyTorch has no fused attention backend, so ``F.scaled_dot_product_attention``
(transformers' default ``attn_implementation="sdpa"``) decomposes into matmuls, a softmax
and an s x s score matrix. A real device runs one fused kernel instead (flash or
memory-efficient attention on a GPU, ``_scaled_dot_product_flash_attention_for_cpu`` on
a CPU), which DTensor shards by batch or heads and which saves only its output and the
log-sum-exp for the backward. Planning the decomposition would price collectives and
memory that never happen.

``FusedAttention``, active while ``trace/tracer.py`` traces, records each such call as the CPU
fused op. Its sharding rule (``dtensor/rules.py``) allows what the GPU kernels' rules
allow, so the plan is the same wherever it runs; at run time the applied model calls
``F.scaled_dot_product_attention`` as written and the device picks its kernel. Calls the
fused kernel cannot take are left to decompose, as they do at run time: a mask that needs
a gradient (T5's learned position bias; the fused kernels give none), and values whose
head size differs from the query's (DeepSeek's latent attention). Grouped-query
attention (fewer key/value heads, ``enable_gqa``) runs fused, as on the device.

On a CPU mesh the fused kernel takes no dropout: ``F.scaled_dot_product_attention`` with
``dropout_p > 0`` (the default of BERT, GPT-2 and others in training) decomposes there, and
its ``(batch, heads, ...)`` to ``(batch * heads, ...)`` reshape gathers split heads
(``dtensor/view_rules.py``), collectives a device's fused kernel never runs.
``sharded_dropout_attention`` runs such a call on each rank's shards instead, as the fused
kernel's sharding rule does: attention is independent per batch row and per head.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from autoplan.dtensor import context_axis
from autoplan.dtensor.rules import attention_mask_placement

aten = torch.ops.aten
FUSED_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
FUSED_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


class FusedAttention(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            fused = _fused(*sdpa_call(args, kwargs))
            if fused is not None:
                return fused
        return func(*args, **kwargs)


class SdpaCall(NamedTuple):
    """The arguments of one ``F.scaled_dot_product_attention`` call, by name."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False

    def run(self) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            self.query, self.key, self.value, attn_mask=self.attn_mask, dropout_p=self.dropout_p,
            is_causal=self.is_causal, scale=self.scale, enable_gqa=self.enable_gqa,
        )


def sdpa_call(args: tuple, kwargs: dict) -> SdpaCall:
    return SdpaCall(*args, **kwargs)


def _fused(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if query.dim() != 4 or key.shape[1] != value.shape[1] or query.shape[1] % key.shape[1]:
        return None
    if query.shape[1] != key.shape[1] and not enable_gqa:
        return None  # an error at run time too: let torch raise it
    if value.shape[-1] != query.shape[-1]:
        # The fused kernel wants one head size for Q, K and V; torch runs the math instead
        # (DeepSeek's multi-head latent attention: 192-wide query and key heads, 128-wide values).
        return None
    if attn_mask is not None and attn_mask.requires_grad:
        return None
    if attn_mask is not None and context_axis.current_axis() is not None and not dropout_p:
        # Planned with a context axis: the step runs causal attention without a mask (the
        # batch has no padding; ``context_attention.split_attention`` refuses any other), but
        # a model cannot read a traced padding mask and builds the causal one. Plan the step
        # that runs, which keeps no mask for the backward.
        attn_mask, is_causal = None, True
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As the fused path does before its kernel: True keeps a score, False masks it out.
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), float("-inf"))
    output, _ = FUSED_FORWARD(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return output


def contiguous_operands(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``F.scaled_dot_product_attention``'s tensor operands made contiguous, for a planned model.

    A DTensor keeps the global strides its meta kernels gave it, but a redistributed local
    tensor can be laid out otherwise (an all-gather along heads stacks the shards). The
    fused kernels lay their output out after their inputs, so the output's local strides
    disagree with its global ones; ``.transpose(1, 2).contiguous()`` is then skipped, the
    global strides saying it is contiguous, and the next ``view`` fails on the shards.
    Contiguous operands give the output the layout the global strides describe. Operands
    whose shards are laid out as the global strides say (a batch- or head-split projection
    transposed to ``(batch, heads, seq, head_dim)``, the usual case) are left as they are:
    a copy of each would be kept for the backward, three activations per layer the plan
    never priced (and the output would then need a copy too).
    """
    leaves, spec = tree_flatten((args, kwargs))
    leaves = [x.contiguous() if isinstance(x, torch.Tensor) and not _laid_out_as_global(x) else x for x in leaves]
    return tree_unflatten(leaves, spec)


def _laid_out_as_global(x: torch.Tensor) -> bool:
    """Whether ``x`` is a DTensor whose global strides and local shard are both dense in one
    order of dims: the kernel then lays out the shard's output as the global one."""
    if not isinstance(x, DTensor):
        return False
    order = sorted(range(x.dim()), key=lambda d: (-x.stride()[d], d))  # outermost dim first
    return _dense_in(x.shape, x.stride(), order) and _dense_in(x._local_tensor.shape, x._local_tensor.stride(), order)


def _dense_in(shape, stride, order) -> bool:
    """Whether a tensor of ``shape`` and ``stride`` is dense with its dims nested in ``order``
    (a dim of size 1 may have any stride)."""
    step = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != step:
            return False
        step *= shape[d]
    return True


def mask_placed_like_query(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with its ``attn_mask`` already in the layout the fused kernel's rule gives it
    for the query's (``rules.attention_mask_placement``): split where the query is split on
    batch or heads and the mask has that dim whole. DTensor moves an op's positional inputs
    to its strategy's layouts but skips keyword arguments (``redistribute_local_args``), and
    ``attn_mask`` is one: a replicated mask would reach the kernel whole next to a
    batch-split query. (HF models pass a 4-D mask under ``torch.compile``; eagerly, None.)"""
    call = sdpa_call(args, kwargs)
    query, mask = call.query, call.attn_mask
    if not isinstance(mask, DTensor) or not isinstance(query, DTensor) or query.dim() != 4 or mask.device_mesh != query.device_mesh:
        return args, kwargs
    if mask.requires_grad:
        return args, kwargs  # no fused kernel takes it: the call decomposes, and its ops move the mask as planned
    if not all(p.is_replicate() or (isinstance(p, Shard) and p.dim in (0, 1)) for p in query.placements):
        return args, kwargs
    wanted = tuple(attention_mask_placement(p, tuple(mask.shape)) for p in query.placements)
    if tuple(mask.placements) == wanted:
        return args, kwargs
    placed = call._replace(attn_mask=mask.redistribute(query.device_mesh, wanted))
    return (placed.query, placed.key, placed.value), {name: getattr(placed, name) for name in SdpaCall._fields[3:]}


def sharded_dropout_attention(args: tuple, kwargs: dict):
    """A CPU mesh's ``F.scaled_dot_product_attention`` call with dropout, run on local shards
    as the fused kernel's rule (``rules._attention_rows``) runs it; None where that
    rule does not apply (no dropout, not a CPU mesh, operands not all split alike on the
    batch or heads dim): the call then runs as written."""
    call = sdpa_call(args, kwargs)
    query, key, value, mask, dropout_p = call[:5]
    if not (isinstance(query, DTensor) and isinstance(key, DTensor) and isinstance(value, DTensor)):
        return None
    operands = (query, key, value)
    if not dropout_p or not all(x.dim() == 4 for x in operands):
        return None
    mesh, placements = query.device_mesh, tuple(query.placements)
    if mesh.device_type != "cpu" or any(tuple(x.placements) != placements or x.device_mesh != mesh for x in operands[1:]):
        return None
    if not all(p.is_replicate() or (isinstance(p, Shard) and p.dim in (0, 1)) for p in placements):
        return None
    local_mask = None
    if mask is not None:
        if not isinstance(mask, DTensor) or mask.requires_grad:
            return None
        wanted = [attention_mask_placement(p, tuple(mask.shape)) for p in placements]
        placed = mask.redistribute(mesh, wanted) if tuple(mask.placements) != tuple(wanted) else mask
        local_mask = placed.to_local()
    local = call._replace(query=query.to_local(), key=key.to_local(), value=value.to_local(), attn_mask=local_mask)
    return DTensor.from_local(local.run(), mesh, placements, run_check=False)
