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

A convolution on fake tensors of the meta device (the trace's) returns a contiguous result,
as torch's fake kernel cannot tell which device kernel would run; but the CPU's (oneDNN)
and CUDA's (cuDNN) kernels both lay the result out channels-last where the input or the
weight is channels-last. ``DEVICE_LAYOUTS`` wraps torch's fake kernel to do the same on the
meta device, so the trace sees the layout the step has: a norm that leaves activations
channels-last, then an adaptive average pool, pools them with a mean and an in-place
restride (``as_strided_``) the trace would otherwise never see.
"""

from __future__ import annotations

import torch
from torch._meta_registrations import _create_grouped_mm_output_tensor
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

aten = torch.ops.aten


def _grouped_mm_any_float(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if mat_a.dtype == torch.bfloat16 and mat_b.dtype == torch.bfloat16:
        return NotImplemented  # torch's own meta kernel, with all its checks
    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
    return FakeTensor(fake_mode, out, mat_a.device)


KERNELS = {aten._grouped_mm.default: _grouped_mm_any_float}

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def laid_out_as_on_device(original):
    """torch's fake kernel of a convolution (or its backward), whose result on the meta
    device is laid out channels-last where the input or the weight is, as the CPU's and
    CUDA's kernels lay it out (the input's gradient and the weight's too)."""

    def kernel(fake_mode, func, *args, **kwargs):
        out = original(fake_mode, func, *args, **kwargs)
        names = [argument.name for argument in func._schema.arguments]
        bound = {**dict(zip(names, args)), **kwargs}
        input_, weight = bound.get("input"), bound.get("weight")
        if not isinstance(input_, FakeTensor) or not isinstance(weight, FakeTensor) or input_.fake_device.type != "meta":
            return out
        layout = _CHANNELS_LAST.get(input_.dim())
        if layout is None or layout not in (suggest_memory_format(input_), suggest_memory_format(weight)):
            return out
        if isinstance(out, tuple):  # convolution_backward: (input's gradient, weight's, bias's)
            return (_laid_out(fake_mode, out[0], layout), _laid_out(fake_mode, out[1], layout), *out[2:])
        return _laid_out(fake_mode, out, layout)

    return kernel


def _laid_out(fake_mode, tensor, layout):
    """``tensor`` with the strides a device kernel's ``empty(..., memory_format=layout)``
    gives, compared stride by stride: a contiguous tensor with unit spatial dims counts
    as channels-last too, but its strides differ (a later pool reads them)."""
    if not isinstance(tensor, FakeTensor) or tensor.dim() not in _CHANNELS_LAST:
        return tensor
    with in_kernel_invocation_manager(fake_mode):
        empty = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta", memory_format=layout)
    if empty.stride() == tensor.stride():
        return tensor
    return FakeTensor(fake_mode, empty, tensor.fake_device)


DEVICE_LAYOUTS = (aten.convolution.default, aten.convolution_backward.default)
"""Ops whose fake kernel ``laid_out_as_on_device`` wraps while autoplan traces."""
