"""A moved local shard is laid out in the order of its DTensor's strides
(``autoplan/dtensor/local_strides.py``)."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.dtensor import overrides


def _dim_order(strides) -> list[int]:
    return sorted(range(len(strides)), key=lambda d: -strides[d])


def test_a_channels_last_tensor_moved_to_another_split_keeps_its_order_and_views_as_it_says():
    """ConvNeXt's block: an activation laid out channels-last, moved from a split by batch
    to a split by channels (a collective hands back a contiguous shard), permuted to
    ``(N, H, W, C)`` and flattened to rows as its DTensor's strides allow."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        whole = torch.randn(8, 16, 4, 4).to(memory_format=torch.channels_last)
        x = distribute_tensor(whole, mesh, [Shard(0)])
        with overrides.installed():
            moved = x.redistribute(mesh, [Shard(1)])
            assert _dim_order(moved._local_tensor.stride()) == _dim_order(moved.stride()) == [0, 2, 3, 1]
            rows = moved.permute(0, 2, 3, 1).view(-1, 16)
        assert tuple(rows.shape) == (128, 16) and tuple(rows._local_tensor.shape) == (128, 4)
    finally:
        dist.destroy_process_group()


def test_without_a_dense_order_a_moved_shard_is_left_as_it_came():
    """An expanded tensor (a stride of zero) is dense in no order: nothing is copied."""
    from autoplan.dtensor.local_strides import _dim_order as dense_order

    assert dense_order((4, 8), (0, 1)) is None
    assert dense_order((2, 3, 4), (12, 1, 3)) == (0, 2, 1)
    assert dense_order((2, 3), (3, 1)) == (0, 1)


def test_an_op_result_is_laid_out_as_its_dtensor_says_where_the_fake_kernel_disagrees_with_the_device_kernel():
    """Doge's and Qwen3-Next's gates: ``softplus`` of rows viewed as ``(batch, seq, n)``,
    read transposed. Its backward (``softplus_backward``, autoplan's own rule) gets the
    gradient in the transposed order; the device kernel lays its result out like the
    gradient, the fake kernel DTensor derives the strides from lays it out contiguous, and
    the backward's ``view`` back to rows (chosen by the DTensor's strides) failed on the shard."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        rows = distribute_tensor(torch.randn(128, 4), mesh, [Shard(0)]).requires_grad_()
        weight = distribute_tensor(torch.randn(8, 4, 16), mesh, [Shard(0)])
        with overrides.installed():
            gate = torch.nn.functional.softplus(rows.view(8, 16, 4))
            (gate.transpose(1, 2) * weight).sum().backward()
            grad = torch.ops.aten.softplus_backward(weight.transpose(1, 2), gate, 1.0, 20.0)
        assert _dim_order(grad._local_tensor.stride()) == _dim_order(grad.stride())
        assert tuple(rows.grad.shape) == (128, 4) and tuple(rows.grad._local_tensor.shape) == (32, 4)
    finally:
        dist.destroy_process_group()



def test_a_moved_shard_takes_its_own_dtensors_order_where_the_target_layout_carries_another():
    """Inkling2's gradient, gathered for a division in the backward: the layout DTensor
    hands its move to reach (from the op's sharding decision) carried the whole tensor's
    strides of an earlier call, read transposed, and the gathered shard was laid out
    transposed under a DTensor that said contiguous; the backward's ``view`` of the sum it
    went into failed. The order comes from the moved DTensor's own strides."""
    from torch.distributed.tensor._dispatch import redistribute_local_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from autoplan.dtensor.local_strides import laid_out_as_global

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        shape = torch.Size((8, 16, 128))
        own = DTensorSpec(mesh, (Shard(0),), TensorMeta(shape, (2048, 128, 1), torch.float32))
        other_calls = DTensorSpec(mesh, (Replicate(),), TensorMeta(shape, (2048, 1, 16), torch.float32))
        moved = laid_out_as_global(redistribute_local_tensor)(torch.randn(2, 16, 128), own, other_calls)
        assert tuple(moved.shape) == tuple(shape) and moved.is_contiguous()
    finally:
        dist.destroy_process_group()
