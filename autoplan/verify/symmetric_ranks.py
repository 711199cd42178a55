"""Sums on a fake process group, as if every rank held this rank's values.

torch's fake process group (one process standing in for every rank) moves no data, and
answers each collective from this rank's input alone: an all_gather tiles it and an
all_to_all hands back its first block, as if every rank held the same values, but an
all_reduce or reduce_scatter that sums returns the input unchanged, as if every other rank
held zeros. A model that reads a value from such a sum then sees a value no rank could:
JetMoE splits its routed tokens by per-expert counts (``tolist()``) that are a sum over the
ranks holding a slice of the tokens, and one slice's counts do not add up to the tokens
being split, so the planned step fails where a real one runs.

``SymmetricSums`` multiplies those sums by the group's size: every collective then agrees
with one picture (every rank holds this rank's values), and values read from them are
consistent with the shapes they steer. The collectives themselves, and so what the step
counts, are unchanged; only their outputs on a fake group are.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_functional = torch.ops._c10d_functional

# op -> (position of the reduce op, position of the group name) in its arguments
_SUMS = {
    _functional.all_reduce: (1, 2),
    _functional.all_reduce_: (1, 2),
    _functional.reduce_scatter_tensor: (1, 3),
}


class SymmetricSums(TorchDispatchMode):
    """``with SymmetricSums(): <step>``: summing collectives on fake groups return the sum
    over every rank of this rank's values; collectives on real groups are left alone."""

    def __init__(self):
        super().__init__()
        self._fake: dict[str, tuple[bool, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor lower the op; its collectives come back here
        output = func(*args, **kwargs)
        where = _SUMS.get(func.overloadpacket)
        if where is not None and str(args[where[0]]).lower() == "sum":
            fake, size = self._group(args[where[1]])
            if fake:
                output.mul_(size)  # all_reduce_ returns its input, summed in place
        return output

    def _group(self, name: str) -> tuple[bool, int]:
        if name not in self._fake:
            group = _resolve_process_group(name)
            self._fake[name] = (dist.get_backend(group) == "fake", group.size())
        return self._fake[name]
