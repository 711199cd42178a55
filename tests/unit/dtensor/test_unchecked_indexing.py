"""``aten._unsafe_index`` and ``aten._unsafe_index_put`` (``index``/``index_put`` without
bounds checks) run under the checked ops' DTensor rules: torch's decomposition of a
bilinear ``interpolate``, which ``torch.compile`` traces, calls them (timm's CoaT
upsampling compiled whole failed: "Sharding propagation failed for aten._unsafe_index.Tensor")."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication

from autoplan.dtensor import overrides

aten = torch.ops.aten


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _upsampled_sum(images):
    return F.interpolate(images, scale_factor=2.0, mode="bilinear", align_corners=False).sum()


def test_unchecked_indexing_keeps_a_split_of_dims_it_does_not_index(mesh):
    images = distribute_tensor(torch.randn(8, 16, 2, 2), mesh, [Shard(0), Shard(1)])
    rows = torch.tensor([[0], [0], [1], [1]])
    cols = torch.tensor([0, 0, 1, 1])
    with overrides.installed(), implicit_replication():
        out = aten._unsafe_index.Tensor(images, [None, None, rows, cols])
    assert tuple(out.placements) == (Shard(0), Shard(1))
    assert tuple(out.shape) == (8, 16, 4, 4)


@pytest.mark.slow
def test_a_compiled_bilinear_upsampling_of_a_split_batch_runs(mesh):
    torch._dynamo.reset()
    images = distribute_tensor(torch.randn(8, 16, 2, 2), mesh, [Shard(0), Shard(1)]).requires_grad_()
    compiled = torch.compile(_upsampled_sum, backend="aot_eager", fullgraph=True)
    with overrides.installed(), overrides.planned_step(), implicit_replication():
        compiled(images).backward()
    assert images.grad is not None and tuple(images.grad.shape) == (8, 16, 2, 2)
    torch._dynamo.reset()


def test_the_borrowed_rules_are_gone_with_the_overrides(mesh):
    propagator = torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator
    with overrides.installed():
        pass
    assert aten._unsafe_index.Tensor not in propagator.op_single_dim_strategy_funcs
    assert aten._unsafe_index.Tensor not in propagator.op_strategy_funcs
