"""DTensor runs a convolution as the strategy it chose reads its operands
(``autoplan/dtensor/convolution.py``): its own convolution handlers, set aside while a plan
runs, ran the local operands as they arrived and could not describe a batch split on two
mesh axes."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides

BATCH, CHANNELS, SEQ, KERNEL = 8, 16, 6, 4


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _depthwise(x, weight):
    """Mamba's causal depthwise convolution (``groups`` is the global channel count)."""
    return F.conv1d(x, weight, padding=KERNEL - 1, groups=CHANNELS)[..., :SEQ]


def test_a_batch_split_on_both_axes_convolves_its_own_rows(mesh):
    """Qwen3.5's linear attention, planned data parallel over the whole mesh: DTensor's
    handler raised "Tensor dim 0 is already sharded on mesh dim 0"."""
    torch.manual_seed(0)
    x_whole, w_whole = torch.randn(BATCH, CHANNELS, SEQ), torch.randn(CHANNELS, 1, KERNEL)
    x = distribute_tensor(x_whole, mesh, [Shard(0), Shard(0)]).requires_grad_()
    weight = distribute_tensor(w_whole, mesh, [Replicate(), Replicate()]).requires_grad_()
    with overrides.installed():
        out = _depthwise(x, weight)
        out.sum().backward()
    assert out.placements == (Shard(0), Shard(0))
    torch.testing.assert_close(out.to_local(), _depthwise(x_whole[:1], w_whole))  # rank 0's row, no collective
    assert x.grad.placements == (Shard(0), Shard(0))
    assert weight.grad.placements == (Partial(), Partial())


def test_a_depthwise_filter_split_by_channel_is_gathered_for_the_strategy(mesh):
    """A filter that reaches the convolution split by channel (Zamba2's, before its plan
    gathered it): DTensor's handler convolved the local shard with the global groups
    ("expected weight to be at least 16 at dimension 0, but got weight of size [4, 1, 4]")."""
    x = distribute_tensor(torch.randn(BATCH, CHANNELS, SEQ), mesh, [Shard(0), Replicate()]).requires_grad_()
    weight = distribute_tensor(torch.randn(CHANNELS, 1, KERNEL), mesh, [Replicate(), Shard(0)]).requires_grad_()
    with overrides.installed():
        out = _depthwise(x, weight)
        out.sum().backward()
    assert out.placements == (Shard(0), Replicate())
    assert tuple(out.to_local().shape) == (BATCH // 2, CHANNELS, SEQ)
    assert tuple(x.grad.to_local().shape) == (BATCH // 2, CHANNELS, SEQ)


def test_uninstalled_dtensor_keeps_its_own_handlers(mesh):
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers
    before = dict(handlers)
    with overrides.installed():
        assert torch.ops.aten.convolution.default not in handlers
    assert handlers == before
