"""Op classes: ATen ops grouped by what one costs as an eager DTensor op, fixed part only.

Every op of a plan runs through DTensor (sharding propagation, wrapping, autograd
recording) and, when it carries a gradient, through its derivative ops in the backward.
That fixed time differs by op: a view's backward is one view, a matmul's is two matmuls
and two transposes, a layer norm's is a fused kernel with three outputs. ``autoplan
calibrate`` times a few representative ops of each class on the mesh
(``calibrate/dispatch_classes.py``) and the profile's ``dispatch.op_classes`` table holds
each class's figures; the cost stage charges a traced op its class's figures, and ops of
no class (or a class the profile lacks) the profile's generic ``forward_op_s`` /
``backward_op_s``.

Classes follow the ops the traced zoo models contain; ops whose measured costs matched
share a class. Measured on 8 gloo ranks sharing 2 CPU cores (2x4 mesh), forward + backward
per op: views ~150 + 200 us, elementwise ops and reductions ~170 + 320, matmuls ~155 + 510,
softmax ~210 + 260, norms ~260 + 370, embedding ~200 + 190, loss ~200 + 130, convolution
~850 + 2000, indexing ~165 + 450 (the generic chain: ~160 + 220). RMSNorm traces to
elementwise ops and a mean, and is priced as those.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

GENERIC = "generic"
"""The class of every op not listed below: priced by the profile's generic figures."""

_CLASS_OPS: dict[str, tuple] = {
    "view": (
        aten.view, aten._unsafe_view, aten.reshape, aten.t, aten.transpose, aten.permute, aten.expand,
        aten.unsqueeze, aten.squeeze, aten.slice, aten.select, aten.alias, aten.detach, aten.as_strided,
        aten.split, aten.split_with_sizes, aten.unbind, aten.chunk, aten.narrow,
    ),
    "elementwise": (
        aten.add, aten.add_, aten.sub, aten.sub_, aten.mul, aten.mul_, aten.div, aten.div_, aten.neg, aten.pow,
        aten.rsqrt, aten.sqrt, aten.exp, aten.log, aten.tanh, aten.sigmoid, aten.relu, aten.gelu, aten.silu,
        aten.sin, aten.cos, aten.clone, aten._to_copy, aten.where, aten.masked_fill, aten.eq, aten.ne, aten.le,
        aten.lt, aten.ge, aten.gt, aten.bitwise_and, aten.bitwise_or, aten.bitwise_not, aten.abs,
        aten.maximum, aten.minimum, aten.clamp, aten.native_dropout, aten.constant_pad_nd, aten.fill,
        # Reductions over a dim measured the same as elementwise ops, forward and backward.
        aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.var_mean, aten.cumsum,
    ),
    "matmul": (aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.matmul, aten.linear),
    "softmax": (aten._softmax, aten._log_softmax, aten._safe_softmax),
    "norm": (aten.native_layer_norm, aten.native_batch_norm, aten._native_batch_norm_legit_functional,
             aten.native_group_norm, aten._fused_rms_norm),
    "embedding": (aten.embedding,),
    "loss": (aten.nll_loss_forward, aten.nll_loss2d_forward, aten.mse_loss, aten.binary_cross_entropy_with_logits),
    "convolution": (aten.convolution,),
    "indexing": (aten.cat, aten.stack, aten.index, aten.gather, aten.scatter, aten.scatter_add, aten.index_select,
                 aten.topk, aten.sort),
}

OP_CLASSES: tuple[str, ...] = tuple(_CLASS_OPS)
"""Every class a profile's ``dispatch.op_classes`` table may hold (``GENERIC`` is not one)."""

_CLASS_OF_PACKET = {packet: name for name, packets in _CLASS_OPS.items() for packet in packets}


def op_class(target) -> str:
    """The class of a traced node's target (an ATen overload), ``GENERIC`` if it has none."""
    packet = getattr(target, "overloadpacket", target)
    return _CLASS_OF_PACKET.get(packet, GENERIC)
