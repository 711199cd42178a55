"""Context parallel: causal attention over a sequence split on one mesh axis.

A plan with a context axis (``Plan.context_parallel``) splits the batch's sequence dim on
that axis, in torch's load-balanced order (``HeadTailLoadBalancer``: of ``2n`` equal
chunks, rank ``r`` of ``n`` holds chunks ``r`` and ``2n-1-r``, so that every rank does
the same causal work). Every op but attention is independent per token, so DTensor runs
it on the local tokens as it runs a batch split; attention is not. For it, each rank
gathers the keys and values of the whole sequence over the axis (an all-gather, as
Llama 3's long-context training did), and its two query chunks attend to the keys before
them: chunk ``j`` (``c`` queries) against the first ``(j+1)c`` keys, causal aligned to
the lower right. The all-gather is torch's autograd-aware functional collective, whose
backward is the reduce-scatter that hands each rank the gradients of its own keys and
values, summed over every rank's queries.

torch's own ``context_parallel`` (``torch.distributed.tensor.experimental``) handles the
CUDA attention kernels only (flash, memory-efficient, cuDNN); a CPU mesh runs
``_scaled_dot_product_flash_attention_for_cpu``, which it rejects. The load balancing here
is torch's (its ``_HeadTailLoadBalancer``); the attention is written on local tensors with
``F.scaled_dot_product_attention`` and ``causal_lower_right``, which a device runs as its
fused kernels.

While a plan with a context axis is planned or runs, ``active(axis)`` is in force: the CPU
attention rule (``rules.py``) then offers, on that axis, only the sequence split (queries,
keys, values, output and log-sum-exp split on their sequence dim), because a sequence held
in the load-balanced order cannot be gathered and attended causally as a whole.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._functional_collectives import all_gather_single_autograd
from torch.distributed.tensor import DTensor, Shard
from torch.nn.attention.bias import causal_lower_right

from autoplan.dtensor import context_axis, overrides
from autoplan.dtensor.context_axis import SEQ_DIM, current_axis
from autoplan.dtensor.fused_attention import FUSED_FORWARD, sdpa_call
from autoplan.errors import PlanError


@contextmanager
def active(axis: int | None):
    """Plan or run with ``axis`` as the context axis (None: no context axis, nothing changes)."""
    if axis is None:
        yield
        return
    context_axis.enter(axis)
    # DTensor's propagation answers for attention depend on the context axis: drop autoplan's
    # cached ones (``overrides.py`` keeps attention's rule out of DTensor's C++ cache).
    overrides.forget_cached_decisions()
    try:
        yield
    finally:
        context_axis.leave()
        overrides.forget_cached_decisions()


def sequence_order(seq_len: int, world: int) -> torch.Tensor:
    """The token order a context axis of ``world`` ranks holds a sequence in (torch's head-tail
    load balancing): rank ``r``'s slice of it is chunks ``r`` and ``2*world-1-r``."""
    if seq_len % (2 * world):
        raise PlanError(
            f"a sequence of {seq_len} tokens cannot be split in {2 * world} equal chunks for a context axis of {world}",
            hint=f"use a sequence length divisible by {2 * world}",
        )
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    return _HeadTailLoadBalancer(seq_len, world, "cpu")._generate_indices(restore=False)[0].long()


def load_balanced(tensor: torch.Tensor, dim: int, world: int) -> torch.Tensor:
    """``tensor`` with its ``dim`` (the sequence) in the context axis's order."""
    return tensor.index_select(dim, sequence_order(tensor.shape[dim], world).to(tensor.device))


def split_attention(args: tuple, kwargs: dict):
    """``F.scaled_dot_product_attention``'s call, run as context parallel where its query is a
    DTensor split on the context axis's sequence dim; None otherwise (the call runs as written)."""
    axis = current_axis()
    if axis is None:
        return None
    call = sdpa_call(args, kwargs)
    query = call.query
    if not isinstance(query, DTensor) or query.dim() != 4 or query.placements[axis] != Shard(SEQ_DIM):
        return None
    if not isinstance(call.key, DTensor) or not isinstance(call.value, DTensor):
        raise PlanError("context parallel attention needs query, key and value as DTensors",
                        hint="re-plan: the model's keys and values should come from its planned projections")
    # As the attention rule reads them (one layout for all three): a value that arrives
    # replicated on the context axis is sliced there, for free.
    key, value = (x if tuple(x.placements) == tuple(query.placements) else x.redistribute(query.device_mesh, query.placements)
                  for x in (call.key, call.value))
    if call.attn_mask is not None and _is_fake(query):
        # A dry run on fake tensors (``verify/dry_run.py``): transformers cannot read a fake
        # padding mask, so it builds the causal mask that a run on real tensors of the same
        # batch (no padding) leaves to ``is_causal``. The same collectives run either way.
        call = call._replace(attn_mask=None, is_causal=True)
    if call.attn_mask is not None or call.dropout_p or not call.is_causal:
        raise PlanError(
            "context parallel runs causal attention without a mask or dropout only",
            hint="pass a batch without padding or packed sequences (autoplan.sequence_batch.causal_lm_batch makes one)"
                 " and no attention dropout, or plan without a context axis",
        )
    mesh = query.device_mesh
    out = gathered_kv_attention(
        query.to_local(), key.to_local(), value.to_local(), mesh.get_group(axis),
        scale=call.scale, enable_gqa=call.enable_gqa,
    )
    return DTensor.from_local(out, mesh, query.placements, run_check=False)


def _is_fake(x: DTensor) -> bool:
    return isinstance(x._local_tensor, FakeTensor)


def gathered_kv_attention(query, key, value, group, scale=None, enable_gqa=False) -> torch.Tensor:
    """Causal attention of this rank's load-balanced query chunks against the whole sequence's
    keys and values, gathered over ``group``; local tensors ``(batch, heads, 2c, head_dim)``."""
    world = torch.distributed.get_world_size(group)
    rank = torch.distributed.get_rank(group)
    if query.shape[SEQ_DIM] % 2:
        raise PlanError("context parallel needs an even number of local tokens",
                        hint="use a sequence length divisible by twice the context axis")
    chunk = query.shape[SEQ_DIM] // 2
    restore = torch.argsort(sequence_order(2 * chunk * world, world)).to(query.device)
    keys = all_gather_single_autograd(key.contiguous(), SEQ_DIM, group).index_select(SEQ_DIM, restore)
    values = all_gather_single_autograd(value.contiguous(), SEQ_DIM, group).index_select(SEQ_DIM, restore)
    outputs = []
    for local, position in enumerate((rank, 2 * world - 1 - rank)):
        q = query.narrow(SEQ_DIM, local * chunk, chunk)
        seen = (position + 1) * chunk  # keys up to the end of this chunk
        k, v = keys.narrow(SEQ_DIM, 0, seen), values.narrow(SEQ_DIM, 0, seen)
        outputs.append(F.scaled_dot_product_attention(
            q, k, v, attn_mask=_lower_right_causal(chunk, seen, query), is_causal=seen == chunk, scale=scale,
            enable_gqa=enable_gqa,
        ))
    return torch.cat(outputs, dim=SEQ_DIM)


def _lower_right_causal(queries: int, keys: int, like: torch.Tensor):
    """The mask of ``queries`` queries that are the last of ``keys`` positions (each sees the
    keys up to its own); None where they are all of them (``is_causal``). A GPU's fused
    kernels take it as ``causal_lower_right`` without a mask in memory; on a CPU torch
    makes that mask anyway, and a ``CausalBias`` cannot be made under a dispatch mode
    (``MemTracker``, the collective counter, fake tensors), so the CPU gets the mask itself."""
    if queries == keys:
        return None
    if isinstance(like, FakeTensor):  # a dry run: a fake mask (a real one would take queries x keys bytes)
        with like.fake_mode:
            return torch.ones(queries, keys, dtype=torch.bool, device=like.device).tril(keys - queries)
    if like.device.type == "cuda":
        return causal_lower_right(queries, keys)
    return torch.ones(queries, keys, dtype=torch.bool, device=like.device).tril(keys - queries)


def kv_gathers(node, in_values, strategy, mesh_shape, requires_grad: bool) -> tuple[list[tuple[str, int, float, bool]], float]:
    """What the fx ``node``'s attention runs itself under ``strategy`` with its sequence split
    on the context axis: ``(kind, axis, bytes, in the backward)`` of the keys' and values'
    all-gathers (bytes: the gathered tensor, as nccl-tests count) and, for the backward,
    their gradients' reduce-scatters (the full input); and the bytes the gathered keys and
    values add to what the forward keeps for the backward (all but the rank's own shard).
    ``([], 0.0)`` for every other op and layout."""
    axis = current_axis()
    if axis is None or node.target is not FUSED_FORWARD or len(strategy.inputs) < 3:
        return [], 0.0
    if strategy.inputs[0][axis] != f"S({SEQ_DIM})":
        return [], 0.0
    size = mesh_shape[axis]
    found: list[tuple[str, int, float, bool]] = []
    kept = 0.0
    for value, spec in zip(in_values[1:3], strategy.inputs[1:3]):
        other_axes = math.prod(n for a, n in enumerate(mesh_shape) if a != axis and spec[a] != "R")
        gathered = value.numel() * value.element_size() / other_axes  # this rank's heads or batch rows, every token
        found.append(("all_gather", axis, float(gathered), False))
        if requires_grad:
            found.append(("reduce_scatter", axis, float(gathered), True))
        kept += gathered * (size - 1) / size
    return found, kept
