"""``unbind`` of a tensor split along the dim it unbinds: the split gathered first.

DTensor's rule for ``aten.unbind.int`` raises where the input is split along the unbound
dim ("Attempted to unbind along the sharded dimension 0 ... disallowed by the current
operator") instead of offering the layout that gathers that dim. A qkv projection whose
output is split by column, reshaped to ``(B, N, 2, heads, head_dim)`` and permuted so the
2 comes first, arrives split along exactly that dim when the split lands on it (timm's
GCViT ``WindowAttentionGlobal``: ``k, v = kv.unbind(0)``), and the step failed there.

``gathering_split_dim`` wraps DTensor's rule (``overrides.py`` installs it): where it
refuses, each input layout split along the unbound dim is offered with that dim
gathered on the axes that split it (the others kept), at the cost of that move; every
output takes the input's remaining splits, shifted past the removed dim, as DTensor's
own rows do.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops.utils import (
    generate_redistribute_costs,
    normalize_dim,
    shift_shard_dims_after_remove,
)

aten = torch.ops.aten

UNBIND = aten.unbind.int
_REFUSAL = "Attempted to unbind along the sharded dimension"


def gathering_split_dim(rule, diverged=lambda: None):
    """DTensor's strategy function ``rule`` for ``unbind``, made to gather a split of the
    unbound dim where it refuses; ``diverged()`` is called whenever it does."""

    def strategy(op_schema: OpSchema):
        try:
            return rule(op_schema)
        except RuntimeError as err:
            if _REFUSAL not in str(err):
                raise
        diverged()
        return _gathering_rows(op_schema)

    return strategy


def _gathering_rows(op_schema: OpSchema) -> OpStrategy:
    input_strategy = op_schema.args_schema[0]
    assert isinstance(input_strategy, OpStrategy), input_strategy  # unbind's self
    dim = op_schema.args_schema[1] if len(op_schema.args_schema) > 1 else 0
    assert isinstance(dim, int), dim
    dim = normalize_dim(dim, input_strategy.ndim)
    mesh = input_strategy.mesh
    rows = []
    for arrived in input_strategy.strategies:
        spec = arrived.output_spec
        kept = tuple(Replicate() if p.is_shard() and getattr(p, "dim", None) == dim else p for p in spec.placements)
        wanted = DTensorSpec(mesh, kept, tensor_meta=spec.tensor_meta)
        outputs = tuple(DTensorSpec(mesh, tuple(shift_shard_dims_after_remove(kept, dim)))
                        for _ in range(input_strategy.shape[dim]))
        rows.append(OpSpec(output_specs=outputs, input_specs=(wanted,),
                           redistribute_cost=[generate_redistribute_costs(input_strategy, wanted)]))
    return OpStrategy(rows)
