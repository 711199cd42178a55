"""The ops autograd runs for an op's backward, found by running that backward on fake tensors.

An op planned replicated for want of a sharding rule needs its backward ops replicated too
(``dtensor/rules.fallback_rules`` gives them the same fallback). Most are named after it
(``<op>_backward``, ``rules.backward_op``), but not all: the backward of ``im2col``
(``F.unfold``: ConvBERT's span convolution) is ``col2im``, which has no rule either, and
the planned step failed in its backward. The ops a backward runs are the ones its
derivative formula calls, so they are read off a run of it: on fake tensors shaped like
the traced node's inputs, once per op signature.
"""

from __future__ import annotations

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map


def backward_ops(node: fx.Node) -> frozenset:
    """The aten ops the backward of ``node``'s op runs, given gradients for every floating
    output; empty where it has none or where it cannot run on fresh fake tensors."""
    with FakeTensorMode():
        leaves: list[torch.Tensor] = []

        def fresh(arg):
            value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
            if not isinstance(value, torch.Tensor):
                return value
            copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
            if copy.is_floating_point():
                copy.requires_grad_()
                leaves.append(copy)
            return copy

        try:
            args, kwargs = tree_map(fresh, (node.args, node.kwargs))
            outputs = [x for x in tree_flatten(node.target(*args, **kwargs))[0] if isinstance(x, torch.Tensor) and x.requires_grad]
            if not outputs:
                return frozenset()
            gradients = [torch.ones_like(x) for x in outputs]
            with _Recorded() as recorded:
                torch.autograd.grad(outputs, leaves, gradients, allow_unused=True)
        except Exception:  # an op whose backward cannot run here: no ops learnt
            return frozenset()
    return frozenset(op for op in recorded.ops if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten")


class _Recorded(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))
