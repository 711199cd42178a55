"""What a traced value is: its bytes, a decision's output values, whether an op is a view.

Shared by the cost stage (``estimate.py``) and the memory rows it builds on
(``memory.py``), which ``estimate.py`` imports: kept here so neither imports the other back.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from autoplan.choices.decision import Decision

aten = torch.ops.aten
VIEW_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default,
    aten.transpose.int, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.detach.default, aten.view.dtype,
}


def tensor_bytes(value) -> float:
    return float(value.numel() * value.element_size()) if isinstance(value, torch.Tensor) else 0.0


def output_values(decision: Decision) -> list:
    """A decision's traced output values (fake tensors), flattened."""
    return tree_flatten(decision.fx_node.meta.get("val"))[0]


def is_view(decision: Decision) -> bool:
    """Whether a decision is a view op (moves no data; its layout follows its input's)."""
    return decision.fx_node.target in VIEW_OPS
