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

from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor
from torch.utils.weak import WeakIdKeyDictionary

_saved = WeakIdKeyDictionary()
"""local tensor of a DTensor autograd saved -> {(version, from spec, to spec): moved local tensor}"""


def reusing(dtensor_move):
    """DTensor's ``dtensor_move``, answering a backward's repeat of a saved forward move."""

    def move(local_tensor, current_spec, target_spec, *args, **kwargs):
        entry = _saved.get(local_tensor)
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


def _pack(tensor):
    if isinstance(tensor, DTensor) and tensor._local_tensor not in _saved:
        _saved[tensor._local_tensor] = {}
    return tensor


def _unpack(tensor):
    return tensor


@contextmanager
def remember_saved_moves():
    """Note what autograd saves while in force (a forward: what an earlier one kept is
    dropped)."""
    _saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        yield
