"""The training loss autoplan plans, applies and checks, and where it sits in a model's output.

The loss of one step is, in this order:

1. ``loss_fn(output, batch)``: the model file's ``compute_loss`` (``loss_fn=`` in the Python
   API), given the model's output and the batch the model was called with (the dict of
   keyword arguments, or else the tuple of positional ones; ``batch_of``);
2. ``output.loss`` (HuggingFace models given labels, a named tuple or dataclass with a
   ``loss`` field) or ``output["loss"]``;
3. the output itself when it is a scalar (0-dim) tensor, or the one scalar tensor of a
   tuple or list output (nanoGPT returns ``(logits, loss)``);
4. else the sum of the output's first tensor. That is no real loss, so the plan's warnings
   say so (``summed_warning``). Two scalars in a tuple are ambiguous: a ``LossError``.

The trace, the apply engine's root module, ``verify_plan`` and the numerics check all take
the loss this way, so the step that is planned is the step that runs.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Partial

from autoplan.errors import ArgumentTypeError, LossError

_DEFINE_IT = "define compute_loss(output, batch) in the model file (loss_fn= in Python)"


@dataclass(frozen=True, slots=True)
class FoundLoss:
    """The loss of a model's output, without a ``loss_fn``."""

    tensor: torch.Tensor
    where: str
    """Its place in the output: "" (the output), ".loss", "['loss']", "[i]"; when summed, the
    place of the tensor that was summed."""
    summed: bool
    """True when the output holds no loss and ``tensor`` is the sum of the tensor at ``where``."""


def training_loss(output) -> torch.Tensor:
    """Loss of one training step, as a plain tensor, from a model's output (rules 2-4 above).

    On a parallel model from ``apply_plan`` the result is the loss of the whole global
    batch, the same on every rank; a model applied with ``loss_fn`` returns that loss itself.
    """
    return plain(find_loss(output).tensor)


def model_loss(output, batch, loss_fn=None) -> torch.Tensor:
    """The loss of one step as a plain tensor: ``loss_fn``'s when given, else ``training_loss``."""
    return training_loss(output) if loss_fn is None else plain(computed_loss(loss_fn, output, batch))


def find_loss(output) -> FoundLoss:
    """The model's own loss in ``output``, or the sum of its first tensor (``summed``)."""
    where = loss_slot(output)
    if where is not None:
        return FoundLoss(value_at(output, where), where, False)
    scalars = _scalar_items(output)
    if len(scalars) > 1:
        named = ", ".join(f"output[{i}]" for i in scalars)
        raise LossError(
            f"the model returns {len(scalars)} scalar tensors ({named}): autoplan cannot tell which is the loss",
            f"{_DEFINE_IT} that returns the loss",
        )
    where, tensor = _first_tensor(output, "")
    if tensor is None:
        raise LossError(
            f"expected the model to return a tensor or an output with a loss, got {type(output).__name__}",
            f"return the loss (or logits) from forward, or {_DEFINE_IT}",
        )
    return FoundLoss(_sum(tensor), where, True)


def _sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor.sum()``; of a DTensor, the sum of each rank's shard as a partial scalar, so
    that the gradient comes back in the tensor's own layout, a view of one scalar. DTensor's
    own ``sum`` hands back a replicated gradient that the tensor's readers then slice one
    mesh axis at a time: the slice on the first axis is copied out, for logits split on two
    axes half the whole logits' size on every rank (the plan counts the shard)."""
    if not isinstance(tensor, DTensor):
        return tensor.sum()
    placements = [Partial() if p.is_shard() else p for p in tensor.placements]
    return DTensor.from_local(tensor.to_local().sum(), tensor.device_mesh, placements, run_check=False)


def summed_warning(where: str) -> str:
    """The plan's one line about a loss taken as the sum of the output."""
    return (
        f"the model returns no loss (.loss, ['loss'] or one scalar tensor): the plan is for output{where}.sum(); "
        f"{_DEFINE_IT} to plan for the real loss"
    )


def loss_slot(output) -> str | None:
    """Where the model's own loss is in ``output`` (see ``FoundLoss.where``), or None when
    it returns none, or several scalars."""
    if isinstance(output, torch.Tensor):
        return "" if output.dim() == 0 else None
    if isinstance(getattr(output, "loss", None), torch.Tensor):
        return ".loss"
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return "['loss']"
    scalars = _scalar_items(output)
    return f"[{scalars[0]}]" if len(scalars) == 1 else None


def value_at(output, where: str):
    """The value at a ``loss_slot`` place."""
    if where == "":
        return output
    if where == ".loss":
        return output.loss
    if where == "['loss']":
        return output["loss"]
    return output[int(where[1:-1])]


def with_value_at(output, where: str, value):
    """``output`` with ``value`` at a ``loss_slot`` place, as a new output: named tuples and
    (frozen) dataclasses take no assignment, and the model's own object stays as it was."""
    if where == "":
        return value
    if where == ".loss":
        if _is_namedtuple(output):
            return output._replace(loss=value)
        if dataclasses.is_dataclass(output) and not isinstance(output, type):
            return dataclasses.replace(output, loss=value)
        new = copy.copy(output)
        new.loss = value
        return new
    if where == "['loss']":
        new = copy.copy(output)
        new["loss"] = value
        return new
    index = int(where[1:-1])
    if _is_namedtuple(output):
        return output._replace(**{output._fields[index]: value})
    items = list(output)
    items[index] = value
    return type(output)(items)


def computed_loss(loss_fn, output, batch) -> torch.Tensor:
    """``loss_fn(output, batch)``, checked to be one scalar tensor."""
    loss = loss_fn(output, batch)
    name = getattr(loss_fn, "__name__", "loss_fn")
    if not isinstance(loss, torch.Tensor):
        raise LossError(
            f"{name}(output, batch) returned {type(loss).__name__}, expected the loss as a scalar tensor",
            f"make {name} return the loss tensor, e.g. F.cross_entropy(logits.flatten(0, 1), targets.flatten())",
        )
    if loss.dim() != 0:
        raise LossError(
            f"{name}(output, batch) returned a tensor of shape {list(loss.shape)}, expected a scalar (0-dim) tensor",
            f"reduce it in {name}, e.g. return loss.mean()",
        )
    return loss


def check_loss_fn(loss_fn) -> None:
    """None, or a callable ``loss_fn(output, batch)``."""
    if loss_fn is not None and not callable(loss_fn):
        raise ArgumentTypeError(
            f"expected loss_fn as a function loss_fn(output, batch), got {type(loss_fn).__name__}",
            "pass e.g. loss_fn=compute_loss, or None to take the model's own loss",
        )


def batch_of(args: tuple, kwargs: dict):
    """The batch ``loss_fn`` gets: the keyword arguments when the model was called with
    keywords only (a dict batch), else the positional ones (a tuple batch)."""
    return dict(kwargs) if kwargs and not args else tuple(args)


def plain(loss: torch.Tensor) -> torch.Tensor:
    """A DTensor loss as a plain tensor with the global value (others unchanged)."""
    full_tensor = getattr(loss, "full_tensor", None)
    return full_tensor() if full_tensor is not None else loss


def _scalar_items(output) -> list[int]:
    if not isinstance(output, (tuple, list)):
        return []
    return [i for i, item in enumerate(output) if isinstance(item, torch.Tensor) and item.dim() == 0]


def first_tensor(output) -> torch.Tensor | None:
    """The first tensor of ``output`` (tuples, lists, dicts, dataclasses), or None."""
    return _first_tensor(output, "")[1]


def _first_tensor(value, where: str) -> tuple[str, torch.Tensor | None]:
    """The first tensor in ``value`` (tuples, lists, dicts, dataclasses) and its place."""
    if isinstance(value, torch.Tensor):
        return where, value
    if isinstance(value, (tuple, list)):
        items = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    elif isinstance(value, Mapping):
        items = [(f"{where}[{key!r}]", item) for key, item in value.items()]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f"{where}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
    else:
        return where, None
    for path, item in items:
        found = _first_tensor(item, path)
        if found[1] is not None:
            return found
    return where, None


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields") and hasattr(value, "_replace")
