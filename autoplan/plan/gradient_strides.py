"""Where a view's backward copies its gradient, and so reduces a partial one.

A view's backward reshapes its output's gradient to the input's shape. Where that
gradient came back through a permute or a transpose, its memory is not in the view's
order, and the reshape copies it: ``clone``, then a view. Attention splits heads so
(``k.view(b, s, nh, hd).transpose(1, 2)``, read by ``bmm`` after a copy): the gradient
``bmm`` hands back is contiguous, the transpose's backward permutes it, and the first
view's backward copies. torch 2.13's DTensor rules ``clone`` pointwise with no partial
placement, so a partial gradient is all-reduced at that copy (DeBERTa-v2's and XGLM's
attention, whose value gradients are partial on dp), where a view would carry it on.
torch 2.14's rule carries a partial input on to the copy, as a view does: whether the
copy reduces is asked of DTensor's registry (``clone_reduces_partial``), not of a version.

The strides are followed back from the ops that make the gradients, on meta tensors
(torch's own view arithmetic decides whether the reshape is a view): a compute op's
backward makes new, contiguous gradients; the CPU fused attention's makes them as its
inputs were laid out before the heads were moved forward (``(b, s, nh, hd)`` memory,
transposed); an elementwise op's follows its output gradient's layout (the iterator
takes the layout of its first operand, the gradient); a view's is the view's inverse
applied to its output's; a value read by several ops gets autograd's sum, a new tensor.
"""

from __future__ import annotations

import functools
from typing import cast

import torch

from autoplan.cost.estimate import is_view, output_values
from autoplan.dtensor.fused_attention import FUSED_FORWARD
from autoplan.dtensor.overrides import installed
from autoplan.plan.gradient_rules import is_elementwise

_aten = torch.ops.aten
RESHAPES = (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default)
"""Views whose backward reshapes the gradient (a copy where its memory is out of order)."""
_SAME_MEMORY = (
    _aten.squeeze.dim, _aten.squeeze.dims, _aten.squeeze.default, _aten.unsqueeze.default,
    _aten.alias.default, _aten.detach.default,
)
"""Views whose backward is a view of the gradient in any layout (size-1 dims, aliases)."""


def copies_gradient(graph, name: str) -> bool:
    """Whether the backward of the view ``name`` copies its output's gradient (``clone``)
    to hand it to its input."""
    decision = graph.decision(name)
    node = decision.fx_node
    if not is_view(decision) or node.target not in RESHAPES:
        return False
    grad = _gradient_like(graph, (name, 0), {})
    if grad is None:
        return False
    try:
        grad.view(tuple(node.args[0].meta["val"].shape))
    except RuntimeError:  # not expressible as a view of that memory
        return True
    return False


@functools.cache
def clone_reduces_partial() -> bool:
    """Whether DTensor's ``clone`` of a partial tensor reduces it (torch 2.13) or carries
    the pending sum on to the copy (2.14): its rule asked, with autoplan's changes in
    force as when a plan runs, on a one-axis planning mesh."""
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema, OutputSharding

    from autoplan.choices.graph import planning_mesh

    mesh = planning_mesh((2,), ("probe",))
    spec = DTensorSpec(mesh, (Partial(),), tensor_meta=TensorMeta(torch.Size((2, 2)), (2, 1), torch.float32))
    with installed():
        propagator = DTensor._op_dispatcher.sharding_propagator
        decided: OutputSharding = propagator.propagate_op_sharding(  # type: ignore[assignment]  # a cached wrapper torch types as object
            OpSchema(_aten.clone.default, (spec,), {}))
    out = decided.output_spec
    assert isinstance(out, DTensorSpec), out  # clone has one tensor output
    return not cast(DTensorSpec, out).placements[0].is_partial()


def _gradient_like(graph, value: tuple[str, int], memo: dict) -> torch.Tensor | None:
    """A meta tensor laid out as autograd hands ``value``'s gradient to its backward, or
    None where ``value`` is not a tensor. ``memo``: value -> that tensor, for this walk."""
    if value in memo:
        return memo[value]
    name, index = value
    values = output_values(graph.decision(name))
    made = values[index] if index < len(values) else None
    if not isinstance(made, torch.Tensor):
        memo[value] = None
        return None
    shape = tuple(made.shape)
    memo[value] = torch.empty(shape, device="meta")  # a new tensor; set before recursing all the same
    readers = [(v, k) for _, v, k, i in graph.reads(name) if i == index and graph.decision(v).requires_grad]
    if len(readers) == 1:  # several: autograd's sum is a new tensor
        v, k = readers[0]
        reader = graph.decision(v)
        node = reader.fx_node
        if node.target is FUSED_FORWARD and k < 3 and len(shape) == 4:
            b, nh, s, hd = shape  # query, key or value: heads moved forward from (b, s, nh, hd) memory
            memo[value] = torch.empty((b, s, nh, hd), device="meta").transpose(1, 2)
        elif is_view(reader) and len(graph.inputs_of(v)) == 1:
            after = _gradient_like(graph, (v, 0), memo)
            if after is not None:
                memo[value] = _view_backward(node, after, shape)
        elif is_elementwise(graph, v) and tuple(node.meta["val"].shape) == shape:
            after = _gradient_like(graph, (v, 0), memo)
            if after is not None:
                memo[value] = torch.empty_strided(shape, after.stride(), device="meta")
    return memo[value]


def _view_backward(node, grad: torch.Tensor, in_shape: tuple) -> torch.Tensor:
    """The gradient the view ``node`` hands its input, given its output's gradient ``grad``."""
    target = node.target
    if target is _aten.permute.default:
        dims = [d % grad.dim() for d in node.args[1]]
        return grad.permute([dims.index(d) for d in range(len(dims))])
    if target is _aten.transpose.int:
        return grad.transpose(node.args[1], node.args[2])
    if target is _aten.t.default:
        return grad.t()
    if target in RESHAPES or target in _SAME_MEMORY:
        return grad.reshape(in_shape)
    return torch.empty(in_shape, device="meta")  # an expand's sum, a slice's scatter into zeros: new memory
