"""Ops the forward runs without autograd.

A forward can run part of itself under ``torch.no_grad()``: HRM runs all but the last of
its recurrent cycles so, to bound activation memory, and a frozen teacher or a target
encoder runs so too. Nothing in the traced graph says so, and the planner would give
those ops a backward (and the module calls around them the gradient moves of one) that
the step never runs. ``no_grad_ops`` notes the graph node of each op run while autograd
is off, but for those inside an ``autograd.Function``'s forward, which autograd always
runs so and whose outputs do get a gradient.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from types import FrameType

import torch
from torch.autograd.function import FunctionCtx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoplan.trace.traced_node import traced_node

_FUNCTION_FILE = "torch/autograd/function.py"


@contextmanager
def no_grad_ops(nodes: set[str]):
    """Inside a traced function: add to ``nodes`` the graph node of each op run without autograd."""
    with _NoGradOps(nodes):
        yield


class _NoGradOps(TorchDispatchMode):
    def __init__(self, nodes: set[str]):
        super().__init__()
        self.nodes = nodes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled() or _in_function_forward():
            return out
        for tensor in tree_flatten(out)[0]:
            node = traced_node(tensor)  # None outside a trace
            if node is not None:
                # a multi-output op's outputs come out through getitem nodes: the op is what ran
                self.nodes.add(node.args[0].name if node.target.__name__ == "getitem" and node.args else node.name)
        return out


def _in_function_forward() -> bool:
    """Whether an ``autograd.Function``'s forward is on the Python stack (it runs with
    autograd off, and reentrant checkpointing is one): torch 2.13's ``apply`` is Python code
    in ``torch/autograd/function.py``; 2.14's is C code, which leaves no frame, so the
    forward is known by the context autograd hands it (``ctx``, a ``FunctionCtx``)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "apply" and code.co_filename.replace("\\", "/").endswith(_FUNCTION_FILE):
            return True
        if code.co_argcount and isinstance(frame.f_locals.get(code.co_varnames[0]), FunctionCtx):
            return True
        frame = frame.f_back
    return False
