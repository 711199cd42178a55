"""``unbind`` along a dim the input arrives split on gathers that dim first, instead of
failing ("Attempted to unbind along the sharded dimension 0": timm's GCViT, ``k, v =
kv.unbind(0)`` on a key-value projection whose split landed on the k/v dim)."""

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def test_a_split_of_the_unbound_dim_is_gathered_and_other_splits_kept(mesh):
    kv = distribute_tensor(torch.randn(2, 8, 16), mesh, [Shard(0), Shard(2)])
    with overrides.installed():
        k, v = kv.unbind(0)
    for half in (k, v):
        assert tuple(half.placements) == (Replicate(), Shard(1))
        assert tuple(half.shape) == (8, 16)
        assert tuple(half.to_local().shape) == (8, 4)


def test_a_split_elsewhere_is_dtensors_own_rule(mesh):
    kv = distribute_tensor(torch.randn(2, 8, 16), mesh, [Shard(1), Replicate()])
    with overrides.installed():
        k, _ = kv.unbind(0)
    assert tuple(k.placements) == (Shard(0), Replicate())


def test_without_the_overrides_dtensor_still_refuses(mesh):
    kv = distribute_tensor(torch.randn(2, 8, 16), mesh, [Shard(0), Replicate()])
    with overrides.installed():
        pass
    with pytest.raises(RuntimeError, match="unbind along the sharded dimension"):
        kv.unbind(0)
