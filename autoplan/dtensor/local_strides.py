"""A moved local shard is laid out in the order of its DTensor's strides.

DTensor computes a DTensor's strides from the whole tensor (its ``tensor_meta``), and a
local op makes the shard's own strides. The two agree while ops run on both alike, but a
collective hands back a contiguous shard whatever the DTensor's strides say: ConvNeXt's
block permutes channels-first activations to channels-last and back, and a gradient
gathered between the permutes came back contiguous under strides that were channels-last.
The next permute then left the shard in another order than the DTensor claimed, and the
backward's ``view`` (which DTensor chooses by the DTensor's strides) failed on the shard
("view size is not compatible with input tensor's size and stride").

An op's own result can disagree the same way. DTensor derives an output's strides by
running the op's fake kernel on the whole tensors, while the shard is what the device
kernel makes, and the two differ for some ops whose fake kernel is a decomposition:
``softplus_backward`` of a gradient read transposed (the gates of Doge, Qwen3.5 and
Qwen3-Next) is laid out like the gradient on the device and contiguous on fake tensors, so
the backward's ``view`` back to rows, which the DTensor's strides allow, failed on the shard.

``laid_out_as_global`` wraps DTensor's move of a local shard, and ``results_laid_out_as_global``
lays out the results of the ops autoplan runs itself (``overrides.py`` installs both):
where the whole tensor is dense in some order of its dims and the shard is not in that
order, the shard is copied into it. The values are the same; no collective changes. (An op
that DTensor decides itself runs in its C++ dispatch, where no Python sees its result:
autoplan's own rules, ``softplus_backward``'s among them, run from Python.)
"""

from __future__ import annotations

import torch


def laid_out_as_global(dtensor_move):
    """DTensor's ``dtensor_move`` of a local shard, the result laid out in the order of the
    moved DTensor's own strides (``current_spec``'s whole tensor): the layout DTensor hands
    over to reach can carry the strides of another call of the op whose sharding decision
    it came from (Inkling2's gradient, gathered for a division, was laid out as an earlier
    call's transposed input, under a DTensor that said contiguous)."""

    def move(local_tensor, current_spec, target_spec, *args, **kwargs):
        moved = dtensor_move(local_tensor, current_spec, target_spec, *args, **kwargs)
        return _laid_out_as(moved, current_spec.tensor_meta or target_spec.tensor_meta)

    return move


def results_laid_out_as_global(local_results, output_spec):
    """An op's local results (a tensor, or a tuple or list of them, as DTensor wraps them
    with ``output_spec``), each laid out in the order of its DTensor's strides. Only for
    results that are new tensors: a view's must stay a view of its input."""
    if isinstance(output_spec, (tuple, list)) and isinstance(local_results, (tuple, list)):
        laid_out = [results_laid_out_as_global(r, s) for r, s in zip(local_results, output_spec)]
        return type(local_results)(laid_out)
    if output_spec is None or isinstance(output_spec, (tuple, list)):
        return local_results
    return _laid_out_as(local_results, output_spec.tensor_meta)


def _laid_out_as(local_tensor, meta):
    """``local_tensor`` copied into the dim order of the whole tensor ``meta`` describes;
    as it is where it is in that order already, or where the whole tensor is dense in none."""
    if meta is None or not isinstance(local_tensor, torch.Tensor) or local_tensor.dim() != len(meta.shape):
        return local_tensor
    shape = tuple(local_tensor.shape)
    wanted = _strides_in_order(shape, _dim_order(tuple(meta.shape), tuple(meta.stride)))
    if wanted is None or _has_strides(shape, local_tensor.stride(), wanted):
        return local_tensor
    return torch.empty_strided(shape, wanted, dtype=local_tensor.dtype, device=local_tensor.device).copy_(local_tensor)


def _dim_order(shape: tuple, stride: tuple) -> tuple[int, ...] | None:
    """The dims from outermost to innermost where a tensor of ``shape`` and ``stride`` is
    dense in that order (no gaps, no overlap); None where it is not."""
    order = tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], d)))
    strides = _strides_in_order(shape, order)
    assert strides is not None  # an order is given
    return order if _has_strides(shape, stride, strides) else None


def _strides_in_order(shape: tuple, order: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Dense strides of ``shape`` with its dims laid out in ``order`` (outermost first)."""
    if order is None:
        return None
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _has_strides(shape: tuple, stride: tuple, wanted: tuple[int, ...]) -> bool:
    """Whether ``stride`` is ``wanted`` on every dim of more than one element (the stride of
    a dim of one element is never read)."""
    return all(size <= 1 or s == w for size, s, w in zip(shape, stride, wanted))
