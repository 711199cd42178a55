"""DTensor's convolution handlers, set aside while autoplan runs a plan.

DTensor runs ``aten.convolution`` and ``aten.convolution_backward`` through custom op
handlers (``torch/distributed/tensor/_tp_conv.py``), written for its older propagation
rules, which split an image's width and exchange halos. They ask the propagation for a
sharding, then run the op on the local operands as they arrived, never moving them to the
layouts the chosen strategy reads, and describe the output by its ``dim_map``:

- an operand laid out otherwise than the strategy reads it runs as it is: a depthwise
  filter split by channel convolves its local shard with the global ``groups`` ("Given
  groups=256, expected weight to be at least 256 at dimension 0, but got weight of size
  [64, 1, 4]");
- a batch split on two mesh axes (``[S(0), S(0)]``), which DTensor's strategies offer and
  plans choose (Qwen3.5's linear attention convolves its whole batch split over dp and tp),
  has no ``dim_map`` ("Tensor dim 0 is already sharded on mesh dim 0, DTensor operator
  implementation does not support things like hybrid sharding strategies yet").

Where DTensor has strategies for these ops, they decide (ahead of the older rules), and
they split the batch or replicate, on every axis: DTensor's ordinary dispatch runs those
exactly, moving each operand to the strategy's layout and running the op on the local
tensors, as for any other op. The planner reads those same strategies. So while autoplan's
changes are installed, the two handlers are set aside (``overrides.py``) for the ops that
have strategies.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

ORDINARY_DISPATCH = (aten.convolution.default, aten.convolution_backward.default)
"""Ops whose DTensor handler is set aside where DTensor has strategies for the op."""


def set_aside(handlers: dict, has_rule) -> list:
    """The ops of ``ORDINARY_DISPATCH`` whose handler to remove from ``handlers`` (DTensor's
    custom op handlers): those it holds and that have strategies (``has_rule``). Without
    strategies the older rules decide, and their handler is the one that runs them."""
    return [op for op in ORDINARY_DISPATCH if op in handlers and has_rule(op)]
