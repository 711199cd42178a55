"""Fake-tensor kernels that accept what the device kernels accept, while autoplan runs.

``torch._grouped_mm`` (transformers' default mixture-of-experts implementation) runs in
float32 on the CPU and on recent GPUs, but its meta kernel still insists on bfloat16, so
a float32 MoE model could neither be traced on fake tensors nor run as DTensors (DTensor
derives every output's shape by running the op's meta kernel). ``KERNELS``
gives the op a fake kernel that computes the output's shape the way the meta kernel does,
for any floating dtype.

``overrides.py`` installs the kernels while autoplan traces or runs a planned model (its
backward included). They only answer calls torch's own meta kernel refuses, so no call
that worked before behaves differently.
"""

from __future__ import annotations

import torch
from torch._meta_registrations import _create_grouped_mm_output_tensor
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

aten = torch.ops.aten


def _grouped_mm_any_float(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16:
        return NotImplemented  # torch's own meta kernel, with all its checks
    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
    return FakeTensor(fake_mode, out, mat_a.device)


KERNELS = {aten._grouped_mm.default: _grouped_mm_any_float}
