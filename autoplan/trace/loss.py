"""The training loss autoplan plans for: ``output.loss`` when the model returns one, else the sum."""

from __future__ import annotations

import torch


def training_loss(output) -> torch.Tensor:
    """Loss of one training step, as a plain tensor, from a model's output.

    HuggingFace models return it as ``.loss`` when given labels; any other model's loss is
    the sum of its (first) output. On a parallel model from ``apply_plan`` the result is the
    loss of the whole global batch, the same on every rank.
    """
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None:
        tensor = output
        while isinstance(tensor, (tuple, list)):
            tensor = tensor[0]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected the model to return a tensor or an object with .loss, got {type(output).__name__}")
        loss = tensor.sum()
    full_tensor = getattr(loss, "full_tensor", None)
    return full_tensor() if full_tensor is not None else loss
