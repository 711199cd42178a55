"""A model's twin on fake tensors: the same modules, every parameter and buffer a fake
tensor of its shape, dtype and strides on the CPU. No memory is held and no kernel runs.

Counting the collectives of a training step needs shapes, not values: DTensor picks its
redistributions from placements and shapes, and the fake process group moves nothing. On
fake tensors ``verify`` counts a 1B-parameter model's step in seconds, where real ones
take minutes of compute and gigabytes of weights (docs/verify.md has the measured figures).

``fake_twin(model)`` deep-copies ``model`` with each parameter and buffer swapped for a
fake one (the copy's memo maps each to its twin, so tied parameters stay tied); the
model itself is left untouched, real or on the meta device alike. The twin's step runs
outside the fake mode, as ``benchmarks/memory.py``'s does: ops on fake tensors stay fake,
and the small tensors the model makes itself (position ids, masks) and the batch stay
real, so DTensor can still read the shard offsets it computes with them.

A step that reads the value of a fake tensor (``.item()``, ``bool(t)``, a shape that
depends on the data such as ``nonzero``'s) cannot run on the twin, except where the value
is known without data: the trace's ``known_values`` mode (``trace/known_values.py``)
answers reads of tensors made from no data (an attention mask of ones), as the eager
step would, and tells transformers that such a tensor is not fake, so that the model takes
its eager path. Any other read raises; ``verify_plan`` then counts on real tensors and
says why (``needs_real_values``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)

DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
"""What a fake tensor raises where the step needs a value it does not hold."""


def fake_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake tensors (see the module docstring)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the step mixes fake weights with real small tensors
    memo: dict[int, object] = {}
    with mode:
        for param in model.parameters():
            if id(param) not in memo:
                memo[id(param)] = nn.Parameter(_fake_like(param), requires_grad=param.requires_grad)
        for buffer in model.buffers():
            if buffer is not None and id(buffer) not in memo:
                memo[id(buffer)] = _fake_like(buffer)
    # Outside the mode: anything else the copy meets (a plain tensor attribute) is copied as it is.
    return copy.deepcopy(model, memo)


def _fake_like(tensor: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor of ``tensor``'s shape, strides and dtype (made inside the fake mode)."""
    return torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device="cpu")


def is_fake(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` (or a DTensor's local shard) is a fake tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return isinstance(local, FakeTensor)


def needs_real_values(err: BaseException) -> str:
    """Why a step on fake tensors failed, in words: a read of a value (``DATA_DEPENDENT``,
    anywhere in the exception's chain) or another error a fake tensor raised."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, DATA_DEPENDENT):
            op = getattr(seen, "func", None)
            return f"the step reads tensor values ({op})" if op is not None else "the step reads tensor values"
        seen = seen.__cause__ or seen.__context__
    first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
    return f"the step failed on fake tensors ({type(err).__name__}: {first})"
