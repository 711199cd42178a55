"""The graph node ``make_fx`` made for a traced tensor.

Three recorders note graph nodes while the forward is traced, each through a hook of its
own: the values autograd saves (``saved.py``, a ``saved_tensors_hooks`` pack hook), the
leaves the forward makes that need a gradient (``grad_leaves.py``, a
``TorchFunctionMode``) and the ops run without autograd (``no_grad.py``, a
``TorchDispatchMode``). Each asks the proxy mode tracing then for a tensor's proxy, and
that lookup belongs to none of them, so it sits here on its own: none of the three
imports another's hook for it.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot


def traced_node(tensor) -> fx.Node | None:
    """The graph node of ``tensor`` in the trace running now; None outside a trace (no
    proxy mode), for a tensor the tracer does not know (made outside the trace) and for
    anything but a tensor."""
    mode = get_proxy_mode()
    if mode is None or not isinstance(tensor, torch.Tensor):
        return None
    slot = get_proxy_slot(tensor, mode.tracer, None)
    return slot.proxy.node if slot is not None else None
