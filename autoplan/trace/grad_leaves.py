"""Tensors the forward makes into leaves that need a gradient.

A forward can make a tensor of its own and ask autograd for its gradient:
``torch.zeros_like(query).requires_grad_()`` (MRA's attention returns that where its
kernel is missing). Nothing in the traced graph says so: the op reads its input for the
shape only, and ``requires_grad_`` is no ATen op. But at run time the backward reaches
that leaf, through every op and module boundary between it and the loss, so the plan's
gradients must too. ``record_grad_leaves`` notes the graph node of each such tensor.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from autoplan.trace.traced_node import traced_node


@contextmanager
def record_grad_leaves():
    """Yields a set that collects the graph node of each tensor made to require a gradient
    while tracing."""
    mode = _GradLeaves()
    with mode:
        yield mode.nodes


class _GradLeaves(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.nodes: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.requires_grad_ and (args[1] if len(args) > 1 else kwargs.get("requires_grad", True)):
            node = traced_node(args[0])
            if node is not None:
                self.nodes.add(node.name)
        return out
