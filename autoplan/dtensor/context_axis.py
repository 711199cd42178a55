"""The context axis in force (``context_attention.active``), read by attention's sharding rule
(``rules.py``) and its tracing (``fused_attention.py``); apart so that they need not import
the context-parallel attention itself."""

from __future__ import annotations

from torch.distributed.tensor import Placement, Shard

SEQ_DIM = 2  # of attention's (batch, heads, seq, head_dim) operands
_axis: list[int] = []  # the context axis in force, innermost last


def current_axis() -> int | None:
    return _axis[-1] if _axis else None


def enter(axis: int) -> None:
    _axis.append(axis)


def leave() -> None:
    _axis.pop()


def attention_rows_on_axis(width: int, mask_shape: tuple | None) -> list[list[Placement]]:
    """The CPU attention rule's rows for the context axis: everything split on the sequence dim
    (the mask, ``(.., q, k)``, on its query dim)."""
    extra: list[Placement] = [] if mask_shape is None else [Shard(len(mask_shape) - 2)]
    return [[Shard(SEQ_DIM)] * width + extra]
