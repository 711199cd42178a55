"""What a "selective" recompute keeps (``Plan.recompute``): one list for the cost stage,
the apply engine, the prediction of the reruns' collectives and export."""

from __future__ import annotations

SELECTIVE_KEEPS = (
    "mm", "addmm", "bmm", "baddbmm", "linear",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_attention_math",
)
"""The ATen ops (``.default``) whose outputs a "selective" recompute keeps: matmuls and
attention, the expensive ops to rerun. One list for apply, the prediction and export."""


def selective_keeps() -> frozenset:
    """``SELECTIVE_KEEPS`` as the op overloads this torch has."""
    import torch

    aten = torch.ops.aten
    return frozenset(getattr(aten, name).default for name in SELECTIVE_KEEPS if hasattr(aten, name))
