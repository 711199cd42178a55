"""Which traced values autograd saves for the backward.

The traced forward runs under autograd like a training step's, so every tensor an op
saves for its backward passes through ``saved_tensors_hooks``' pack hook; under
``make_fx`` that tensor has a proxy, whose graph node is the value kept. Only those stay
alive from the forward to the backward: the output of an ``add`` or of a linear layer
followed by a residual is freed at once, the input of a matmul is kept, and a parameter
or batch tensor an op saves is already there (its memory is counted as such).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot


@contextmanager
def record_saved():
    """Yields a set that collects the names of the graph nodes autograd saves while tracing."""
    saved: set[str] = set()

    def pack(tensor):
        mode = get_proxy_mode()
        if mode is not None and isinstance(tensor, torch.Tensor):
            proxy = get_proxy_slot(tensor, mode.tracer, None)
            if proxy is not None:
                saved.add(proxy.proxy.node.name)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved
