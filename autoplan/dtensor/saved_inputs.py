"""A value DTensor redistributed for an op in the forward is not redistributed again for its backward.

DTensor moves an op's inputs to the layout its strategy takes below autograd, so autograd
saves the input as it arrived: ``q * cos`` with ``cos`` split on dp gathers ``cos`` for the
product, and the product's backward (``grad * cos``) gathers it once more. The plan
prices a redistribution once per edge, as if the moved value were what autograd keeps
(as it is where ``apply_plan`` redistributes explicitly: module boundaries, parameters).

``remember_saved_moves`` (entered with ``apply.engine.plan_execution``) notes the tensors
autograd saves in the forward; ``reusing`` (DTensor's move as its dispatcher calls it,
wrapped by ``overrides.py`` while a planned model runs) keeps the forward redistributions of
those beside them (they die with them), and a backward op that asks for the same move of
the same, unchanged tensor gets the kept result instead of running the collectives again. Forward ops never reuse
one: the plan prices each forward read on its own.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.utils.weak import WeakIdKeyDictionary

_saved = WeakIdKeyDictionary()
"""local tensor of a DTensor autograd saved -> {(version, from spec, to spec): moved local tensor}"""

_by_view: dict[tuple, list[weakref.ref]] = {}
"""(dtype, shape, stride, storage offset) -> the saved local tensors with that view of their storage.

Autograd hands a saved parameter back to its backward as a fresh alias (a shallow copy of the
same storage, sharing its version counter), so the backward's move names another tensor than the
forward's did: the kept move is found through the storage it aliases."""

_by_dims: dict[tuple, list[weakref.ref]] = {}
"""(dtype, sorted (size, stride) pairs, storage offset) -> the saved local tensors: those a
backward's permuted view (``w.T``) of a saved tensor may be a view of."""


def reusing(dtensor_move):
    """DTensor's ``dtensor_move``, answering a backward's repeat of a saved forward move."""

    def move(local_tensor, current_spec, target_spec, *args, **kwargs):
        entry = _saved.get(local_tensor)
        if entry is None and torch._C._current_autograd_node() is not None:
            entry = _saved_alias_entry(local_tensor)
            if entry is None:
                kept = _kept_through_permutation(local_tensor, current_spec, target_spec)
                if kept is not None:
                    return kept
        if entry is None:
            return dtensor_move(local_tensor, current_spec, target_spec, *args, **kwargs)
        key = (local_tensor._version, current_spec, target_spec)
        if torch._C._current_autograd_node() is not None:  # in the backward
            kept = entry.get(key)
            if kept is not None:
                return kept
            return dtensor_move(local_tensor, current_spec, target_spec, *args, **kwargs)
        moved = dtensor_move(local_tensor, current_spec, target_spec, *args, **kwargs)
        if any(kept[0] != key[0] for kept in entry):  # changed in place since: those are stale
            entry.clear()
        entry[key] = moved
        return moved

    return move


def _view_key(local_tensor):
    return (local_tensor.dtype, tuple(local_tensor.shape), local_tensor.stride(), local_tensor.storage_offset())


def _dims_key(local_tensor):
    """The same for every permuted view of a tensor."""
    dims = tuple(sorted(zip(local_tensor.shape, local_tensor.stride())))
    return (local_tensor.dtype, dims, local_tensor.storage_offset())


def _saved_alias_entry(local_tensor):
    for saved in _by_view.get(_view_key(local_tensor), ()):
        original = saved()
        if original is not None and torch._C._is_alias_of(original, local_tensor):
            return _saved.get(original)
    return None


def _kept_through_permutation(local_tensor, current_spec, target_spec):
    """The kept forward move of a saved tensor that ``local_tensor`` is a permuted view of,
    permuted alike; None where there is none. A matrix product saves its operand and its
    backward multiplies by the operand's transpose (``grad @ w.T``): where DTensor gathered
    the operand for the forward product, the transpose asks for the same gather (Longformer's
    output head, whose weight the product gathered because its input came split by rows)."""
    for saved in _by_dims.get(_dims_key(local_tensor), ()):
        original = saved()
        order = None if original is None else _permutation(original, local_tensor)
        if order is None or not torch._C._is_alias_of(original, local_tensor):
            continue
        for (version, before, after), moved in _saved.get(original, {}).items():
            if (
                version == local_tensor._version
                and before.mesh == current_spec.mesh
                and _permuted(before.placements, order) == tuple(current_spec.placements)
                and _permuted(after.placements, order) == tuple(target_spec.placements)
            ):
                return moved.permute(order)
    return None


def _permutation(original, view) -> tuple[int, ...] | None:
    """``order`` with ``view`` laid out as ``original.permute(order)`` (same storage offset,
    sizes and strides permuted), other than the identity; None where there is none."""
    if view.dim() != original.dim() or view.storage_offset() != original.storage_offset():
        return None
    dims = list(zip(original.shape, original.stride()))
    order: list[int] = []
    for size_stride in zip(view.shape, view.stride()):
        found = next((d for d, pair in enumerate(dims) if d not in order and pair == size_stride), None)
        if found is None:
            return None
        order.append(found)
    return tuple(order) if order != sorted(order) else None


def _permuted(placements, order: tuple[int, ...]) -> tuple | None:
    """Placements of a tensor as placed on its view ``tensor.permute(order)``: a split of
    dim ``order[d]`` is a split of the view's dim ``d``. None for a strided split, which
    no plain split of the view stands for."""
    if any(isinstance(p, Shard) and type(p) is not Shard for p in placements):
        return None
    return tuple(Shard(order.index(p.dim)) if isinstance(p, Shard) else p for p in placements)


def _pack(tensor):
    if isinstance(tensor, DTensor) and tensor._local_tensor not in _saved:
        local_tensor = tensor._local_tensor
        _saved[local_tensor] = {}
        _by_view.setdefault(_view_key(local_tensor), []).append(weakref.ref(local_tensor))
        _by_dims.setdefault(_dims_key(local_tensor), []).append(weakref.ref(local_tensor))
    return tensor


def _unpack(tensor):
    return tensor


@contextmanager
def remember_saved_moves():
    """Note what autograd saves while in force (a forward: what an earlier one kept is
    dropped)."""
    _saved.clear()
    _by_view.clear()
    _by_dims.clear()
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        yield
