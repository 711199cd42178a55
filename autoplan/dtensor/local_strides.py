"""A moved local shard is laid out in the order of its DTensor's strides.

DTensor computes a DTensor's strides from the whole tensor (its ``tensor_meta``), and a
local op makes the shard's own strides. The two agree while ops run on both alike, but a
collective hands back a contiguous shard whatever the DTensor's strides say: ConvNeXt's
block permutes channels-first activations to channels-last and back, and a gradient
gathered between the permutes came back contiguous under strides that were channels-last.
The next permute then left the shard in another order than the DTensor claimed, and the
backward's ``view`` (which DTensor chooses by the DTensor's strides) failed on the shard
("view size is not compatible with input tensor's size and stride").

``laid_out_as_global`` wraps DTensor's move of a local shard (``overrides.py`` installs it):
where the whole tensor is dense in some order of its dims and the moved shard is not in
that order, the shard is copied into it. The values are the same; no collective changes.
"""

from __future__ import annotations

import torch


def laid_out_as_global(dtensor_move):
    """DTensor's ``dtensor_move`` of a local shard, the result laid out in the order of the
    target DTensor's strides."""

    def move(local_tensor, current_spec, target_spec, *args, **kwargs):
        moved = dtensor_move(local_tensor, current_spec, target_spec, *args, **kwargs)
        meta = target_spec.tensor_meta or current_spec.tensor_meta
        if meta is None or not isinstance(moved, torch.Tensor) or moved.dim() != len(meta.shape):
            return moved
        wanted = _strides_in_order(tuple(moved.shape), _dim_order(tuple(meta.shape), tuple(meta.stride)))
        if wanted is None or _has_strides(tuple(moved.shape), moved.stride(), wanted):
            return moved
        return torch.empty_strided(moved.shape, wanted, dtype=moved.dtype, device=moved.device).copy_(moved)

    return move


def _dim_order(shape: tuple, stride: tuple) -> tuple[int, ...] | None:
    """The dims from outermost to innermost where a tensor of ``shape`` and ``stride`` is
    dense in that order (no gaps, no overlap); None where it is not."""
    order = tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], d)))
    return order if _has_strides(shape, stride, _strides_in_order(shape, order)) else None


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
