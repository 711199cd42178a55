"""Fake-tensor kernels that accept what the device kernels accept, while autoplan runs.

``torch._grouped_mm`` (transformers' default mixture-of-experts implementation) runs in
float32 on the CPU and on recent GPUs, but its meta kernel still insists on bfloat16, so
a float32 MoE model could neither be traced on fake tensors nor run as DTensors (DTensor
derives every output's shape by running the op's meta kernel). ``device_dtype_kernels``
gives the op a fake kernel that computes the output's shape the way the meta kernel does,
for any floating dtype, and takes it away again on exit: outside autoplan's own trace and
planned model, torch is unchanged.

A planned model's backward runs after its forward has returned, outside every context
autoplan can enter, so ``apply_plan`` installs the kernels for the rest of the process
(``install_for_process``). They only answer calls torch's own meta kernel refuses, so no
call that worked before behaves differently.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch._meta_registrations import _create_grouped_mm_output_tensor
from torch._subclasses.fake_impls import op_implementations_dict
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

aten = torch.ops.aten

_lock = threading.Lock()
_depth = 0


def _grouped_mm_any_float(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16:
        return NotImplemented  # torch's own meta kernel, with all its checks
    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
    return FakeTensor(fake_mode, out, mat_a.device)


_KERNELS = {aten._grouped_mm.default: _grouped_mm_any_float}


def install_for_process() -> None:
    """Keep the kernels installed from now on (a planned model's backward needs them)."""
    global _depth
    with _lock:
        _install()
        _depth += 1  # never returns to zero: no context exit uninstalls them


def _install() -> None:
    for op, kernel in _KERNELS.items():
        if op not in op_implementations_dict:  # never replace a kernel torch registered
            op_implementations_dict[op] = kernel


@contextmanager
def device_dtype_kernels():
    """Install the fake kernels above for the duration (re-entrant, thread-safe)."""
    global _depth
    with _lock:
        if _depth == 0:
            _install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for op, kernel in _KERNELS.items():
                    if op_implementations_dict.get(op) is kernel:
                        del op_implementations_dict[op]
