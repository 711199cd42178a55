"""An in-place op run replicated (no DTensor rule) on a self that arrives split.

An op with no DTensor sharding rule runs replicated: the plan's fallback ops, and an op a
planned step meets that the trace never saw (``rules.replicate_everything``). For an
in-place op (``hardswish_`` of ``nn.Hardswish(inplace=True)``: timm's MobileNetV3 and
EfficientViT) that rule moves self to replicated, runs the op on the gathered copy, and
hands self back labelled replicated, while self's own local tensor stays the shard it
was, untouched: a DTensor whose local tensor is smaller than its spec says, which the next
op that moves it fails on (``_maybe_unpad_tensor``: "Expected cond to be True"), and whose
values never saw the op. DTensor's own rules never move an in-place op's self ("in-place
operations that require placement changes are not supported"); the fallback rule, which
cannot know the op's semantics, has to.

So while such an op is a fallback, a custom op handler runs it: every DTensor operand
gathered to replicated (as the replicated rule moves them), the op run in place on the
gathered self, that result split back as self arrived and written into self's own shard.
Self keeps its layout, as an in-place op keeps it under every other DTensor rule; the
collectives are the replicated rule's, and a self that arrives whole is written directly.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.utils._pytree import tree_leaves, tree_map_only

from autoplan.dtensor.strategies import is_inplace


def applies_to(op) -> bool:
    """Whether ``op`` (an op run replicated for want of a rule) needs the handler: an
    in-place op whose first argument is the self it writes."""
    if not isinstance(op, torch._ops.OpOverload) or not is_inplace(op):
        return False
    arguments = op._schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write


def handler(op_call, args, kwargs):
    """DTensor custom op handler: ``op_call`` run on self gathered, written back into self's shard."""
    self = args[0]
    mesh = next(t for t in tree_leaves((args, kwargs)) if isinstance(t, DTensor)).device_mesh
    everywhere = [Replicate()] * mesh.ndim
    gathered_args, gathered_kwargs = tree_map_only(DTensor, lambda t: t.redistribute(mesh, everywhere), (args, kwargs))
    local_args, local_kwargs = tree_map_only(DTensor, lambda t: t._local_tensor, (gathered_args, gathered_kwargs))
    op_call(*local_args, **local_kwargs)  # in place on the gathered self (self's own local tensor, if it came whole)
    if isinstance(self, DTensor) and tuple(self.placements) != tuple(everywhere):
        back = gathered_args[0].redistribute(mesh, self.placements)
        self._local_tensor.copy_(back._local_tensor)
    return self
