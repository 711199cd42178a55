"""The all_reduces a training step's loss causes (``plan/collectives.py`` predicts them).

- ``apply_plan`` hands back the global loss, so a loss left partial on a mesh axis is
  all-reduced there, at the root;
- a mean ``nll_loss`` split over the batch leaves its count of counted targets
  (``total_weight``, its second output) partial too: each rank counts its own targets.
  Its backward reads the count replicated, so DTensor all-reduces it there.

The cost stage does not price them. Priced, a few bytes each, the solver would rather
gather the logits at the root to compute the loss whole; but the root's ops have no
module boundary where ``apply_plan`` could gather them, and DTensor keeps the loss split
there all the same, so the run would differ from such a plan.
"""

from __future__ import annotations

import torch

from autoplan.placements import is_partial

_NLL_LOSSES = (torch.ops.aten.nll_loss_forward.default, torch.ops.aten.nll_loss2d_forward.default)
_MEAN = 1  # torch's Reduction.MEAN


def loss_output(choices) -> tuple[str, int] | None:
    """The decision that computes the loss (the traced step's only output), and which of its
    outputs the loss is (a multi-output op's loss comes out through ``getitem``)."""
    loss = choices.traced.loss_value
    return loss if loss is not None and loss[0] in choices.graph else None


def loss_reductions(loss: tuple[str, int], fx_node, strategy, mesh_shape) -> list[tuple[bool, int, int]]:
    """``(at the root, mesh axis, output index)`` per all_reduce the loss op causes when it
    runs with ``strategy``: the loss itself (at the root), then what its backward reads
    replicated (in the op's own module)."""
    _, out_index = loss
    found = [(True, axis, out_index) for axis in _partial_axes(strategy.outputs[out_index], mesh_shape)]
    for index in _replicated_in_backward(fx_node):
        found += [(False, axis, index) for axis in _partial_axes(strategy.outputs[index], mesh_shape)]
    return found


def _partial_axes(spec, mesh_shape) -> list[int]:
    return [axis for axis, placement in enumerate(spec) if is_partial(placement) and mesh_shape[axis] > 1]


def _replicated_in_backward(fx_node) -> tuple[int, ...]:
    """Outputs of the loss op that its backward op reads replicated."""
    if fx_node.target in _NLL_LOSSES and _argument(fx_node, 3, "reduction", _MEAN) == _MEAN:
        return (1,)
    return ()


def _argument(fx_node, index: int, name: str, default):
    if len(fx_node.args) > index:
        return fx_node.args[index]
    return fx_node.kwargs.get(name, default)
