"""Values the trace knows: tensors that the forward made from no data, every element one number.

A forward can decide on values. transformers builds an attention mask of ones when the batch
has none, then skips the mask when it reads that it is all ones: SDPA runs without one (or
the eager attention adds none). But it reads only outside tracing: ``is_tracing(mask)`` is
true for a fake tensor, so a trace builds the mask, adds it to every layer's scores, and
the plan's prediction holds moves of a mask that the training step never makes (BigBird,
ConvBERT, LUKE, Megatron-BERT, RoFormer, TAPAS). The trace must be the step the device
runs. (A mask made from the batch's values, T5Gemma's ``input_ids != pad_token_id``, stays
unknown: the eager step reads the batch, which the trace cannot.)

``known_values()`` pushes a dispatch mode inside ``make_fx`` that keeps, for each tensor
made from no data (``ones``, ``zeros``, ``full`` and their ``_like``/``new_`` forms), the
one value all its elements hold, and carries it through what keeps it one value: views,
copies and casts of it, pointwise ops of such tensors and numbers, and ops on small such
tensors whose result is again one value (``all``, ``sum``). Reading such a tensor's value
(``bool(t)``, ``t.item()``) returns it, as the eager step would, and leaves nothing in the
graph. A write into a tensor forgets what was known of its storage. Reading any other
value is the data-dependent read it always was.

A tensor made from no data that holds several values, ``arange``'s positions, is known as
its real value (a CPU tensor) while it has at most ``ARRAY_LIMIT`` elements, and so is what
ops make of known tensors alone (run for real): transformers makes position ids with
``arange`` and, given no attention mask, reads whether they hold packed sequences
(``find_packed_sequence_indices``); the eager step reads one sequence per row and runs SDPA
causal without a mask, where a trace that could not read it would build a batch x 1 x
seq x seq mask in every layer.

While it is on, transformers' fake-tensor check (``import_utils.is_fake_tensor``, which
``is_tracing`` asks) answers False for a tensor whose value is known, on the tracing
thread only: the model takes its eager path exactly where that path reads a known value.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from autoplan.trace.eager_checks import eager_checks

aten = torch.ops.aten

# op -> the value every element of its result holds
_FILLS = {
    aten.ones: 1, aten.ones_like: 1, aten.new_ones: 1,
    aten.zeros: 0, aten.zeros_like: 0, aten.new_zeros: 0,
}
# op -> position of the argument that holds its fill value
_FILL_AT = {aten.full: 1, aten.full_like: 1, aten.new_full: 2, aten.scalar_tensor: 0, aten.fill: 1, aten.fill_: 1}

# Ops whose every output element is an element of their first input.
_SAME_VALUES = {
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.unsqueeze, aten.squeeze, aten.permute,
    aten.transpose, aten.t, aten.slice, aten.select, aten.alias, aten.clone, aten.contiguous, aten._to_copy,
    aten.detach, aten.repeat, aten.index, aten.index_select, aten.gather, aten.narrow, aten.flatten,
    aten.unflatten, aten.as_strided, aten.lift_fresh_copy, aten.diagonal, aten.movedim, aten.unfold,
}
_MADE_FROM_NO_DATA = {aten.arange}
"""Ops whose result is known as a whole (several values) from their numbers alone."""
ARRAY_LIMIT = 1 << 22
"""Most elements a tensor known as a real value (not one number) may have: position ids of
a batch of sequences, and what the mask functions make of them."""
_READ = aten._local_scalar_dense.default
"""What ``bool(t)`` and ``t.item()`` come down to in dispatch."""

SMALL = 1 << 16
"""Most elements a known tensor is made of for real to run an op that is neither pointwise
nor a rearrangement (a reduction of a padding mask of batch x sequence); up to
``ARRAY_LIMIT`` where the op is no product (``_cheap``)."""

_local = threading.local()
"""``mode``: the ``_KnownValues`` mode of this thread's trace, or absent."""
_lock = threading.Lock()
_users = 0
_original_is_fake: Callable[[object], bool] | None = None


@contextmanager
def known_values():
    """Inside a traced function: keep known values (the module docstring says which)."""
    outer = getattr(_local, "mode", None)
    mode = _KnownValues()
    _local.mode = mode
    _patch_transformers()
    try:
        with mode, eager_checks():  # and the checks transformers runs only eagerly, as it runs them
            yield mode
    finally:
        _unpatch_transformers()
        _local.mode = outer


class _KnownValues(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.values = WeakTensorKeyDictionary()
        """tensor -> the Python number every element of it holds."""
        self.arrays = WeakTensorKeyDictionary()
        """tensor -> its real value (a CPU tensor), where its elements differ."""

    def value_of(self, tensor) -> int | float | bool | None:
        return self.values.get(tensor) if isinstance(tensor, torch.Tensor) else None

    def array_of(self, tensor) -> torch.Tensor | None:
        """The real value of a tensor known to hold several values, else None."""
        return self.arrays.get(tensor) if isinstance(tensor, torch.Tensor) else None

    def is_known(self, tensor) -> bool:
        return self.value_of(tensor) is not None or self.array_of(tensor) is not None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _READ:
            value = self.value_of(args[0])
            if value is not None and args[0].numel() == 1:
                return value
            array = self.array_of(args[0])
            if array is not None and array.numel() == 1:
                return array.item()
        out = func(*args, **kwargs)
        written = _written(func, args, kwargs)
        for tensor in written:
            self._forget(tensor)
        if isinstance(out, torch.Tensor) and not (written and out._is_view()):
            value = self._value_after(func, args, kwargs, out)
            if isinstance(value, torch.Tensor):
                self.arrays[out] = value
            elif value is not None:
                self.values[out] = value
        return out

    def _forget(self, tensor: torch.Tensor) -> None:
        storage = StorageWeakRef(tensor.untyped_storage())
        for table in (self.values, self.arrays):
            for known in [t for t in list(table) if StorageWeakRef(t.untyped_storage()) == storage]:
                del table[known]

    def _value_after(self, func, args, kwargs, out: torch.Tensor):
        packet = func.overloadpacket
        if packet in _FILLS:
            return _cast(_FILLS[packet], out.dtype)
        if packet in _FILL_AT and len(args) > _FILL_AT[packet] and not isinstance(args[_FILL_AT[packet]], torch.Tensor):
            return _cast(args[_FILL_AT[packet]], out.dtype)
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if packet in _MADE_FROM_NO_DATA and not tensors and out.numel() <= ARRAY_LIMIT:
            return _run_real(func, args, kwargs, None, whole=True)
        if not tensors or torch.Tag.nondeterministic_seeded in func.tags:
            return None
        if any(self.array_of(t) is not None for t in tensors):
            if not all(self.is_known(t) for t in tensors) or out.numel() > ARRAY_LIMIT:
                return None
            return _run_real(func, args, kwargs, self._real, whole=True)
        if packet in _SAME_VALUES:
            value = self.value_of(args[0])
            return None if value is None else _cast(value, out.dtype)
        values = [self.value_of(t) for t in tensors]
        if any(v is None for v in values):
            return None
        if torch.Tag.pointwise in func.tags:
            return _run_real(func, args, kwargs, lambda t: torch.tensor(self.values[t], dtype=t.dtype))
        if all(t.numel() <= SMALL for t in tensors) or _cheap(func, tensors, out):
            return _run_real(func, args, kwargs, self._real)
        return None


    def _real(self, tensor: torch.Tensor) -> torch.Tensor:
        """A known tensor's value as a CPU tensor (one number broadcast to its shape)."""
        array = self.array_of(tensor)
        if array is not None:
            return array
        return torch.tensor(self.values[tensor], dtype=tensor.dtype).expand(tensor.shape)


def _cheap(func, tensors, out: torch.Tensor) -> bool:
    """Whether running ``func`` for real costs about its elements: no product (no FLOP
    formula in torch's counter), inputs and result within ``ARRAY_LIMIT`` elements (a scan
    of position ids over the whole batch, larger than ``SMALL``)."""
    from torch.utils.flop_counter import flop_registry

    return func.overloadpacket not in flop_registry and out.numel() + sum(t.numel() for t in tensors) <= ARRAY_LIMIT


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (in place, or ``out=``)."""
    written: list[torch.Tensor] = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.is_write:
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            written.extend(v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor))
    return written


def _run_real(func, args, kwargs, real, whole: bool = False):
    """``func`` on CPU tensors that ``real`` makes of the known ones: the one value of its
    tensor result; where the result holds several values, None, or with ``whole`` the
    result itself (a CPU tensor). None where it holds none."""
    leaves, spec = tree_flatten((args, kwargs))
    with _disable_current_modes():
        leaves = [real(x) if isinstance(x, torch.Tensor) else _on_cpu(x) for x in leaves]
        args, kwargs = spec.unflatten(leaves)
        try:
            result = func(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, NotImplementedError):  # an op CPU tensors cannot run
            return None
        if not isinstance(result, torch.Tensor) or result.numel() == 0:
            return None
        first = result.reshape(-1)[0]
        if bool((result == first).all()):
            return first.item()
        return result if whole else None


def _on_cpu(value):
    return torch.device("cpu") if isinstance(value, torch.device) else value


def _cast(value, dtype: torch.dtype):
    with _disable_current_modes():
        return torch.tensor(value, dtype=dtype).item()


def _is_fake_unless_known(tensor) -> bool:
    mode = getattr(_local, "mode", None)
    if mode is not None and mode.is_known(tensor):
        return False
    assert _original_is_fake is not None  # installed before this replaces it
    return _original_is_fake(tensor)


def _patch_transformers() -> None:
    global _users, _original_is_fake
    with _lock:
        _users += 1
        module: Any = sys.modules.get("transformers.utils.import_utils")
        if _users == 1 and module is not None and hasattr(module, "is_fake_tensor"):
            _original_is_fake = module.is_fake_tensor
            module.is_fake_tensor = _is_fake_unless_known


def _unpatch_transformers() -> None:
    global _users, _original_is_fake
    with _lock:
        _users -= 1
        module: Any = sys.modules.get("transformers.utils.import_utils")
        if _users == 0 and _original_is_fake is not None:
            if module is not None:
                module.is_fake_tensor = _original_is_fake
            _original_is_fake = None
