"""``as_strided`` that DTensor cannot express (made by ``torch.compile``'s regeneration of
aliased outputs: timm's Qwen3-ViT and CPUBone compiled whole failed with "as_strided not
supported with DTensor") runs on the gathered tensor, replicated, in a planned step."""

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides, restrided


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _diagonal_view(t):
    return torch.as_strided(t, (8,), (17,))  # the diagonal of an 8 x 16 matrix: no permutation of its dims


def test_a_view_dtensor_cannot_express_runs_replicated_with_a_warning(mesh):
    whole = torch.randn(8, 16)
    value = distribute_tensor(whole.clone(), mesh, [Replicate(), Replicate()])
    restrided._warned.clear()
    with overrides.installed(), overrides.planned_step(), pytest.warns(UserWarning, match="as_strided"):
        diagonal = _diagonal_view(value)
    assert tuple(diagonal.placements) == (Replicate(), Replicate())
    torch.testing.assert_close(diagonal.to_local(), _diagonal_view(whole))


def test_a_split_input_is_gathered_first(mesh):
    value = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    with overrides.installed(), overrides.planned_step(), pytest.warns(UserWarning, match="as_strided"):
        restrided._warned.clear()
        diagonal = _diagonal_view(value)
    assert tuple(diagonal.placements) == (Replicate(), Replicate())
    assert tuple(diagonal.to_local().shape) == (8,)


def test_outside_a_planned_step_dtensor_still_refuses(mesh):
    value = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    with overrides.installed(), pytest.raises(RuntimeError, match="as_strided not supported"):
        _diagonal_view(value)
    with pytest.raises(RuntimeError, match="as_strided not supported"):
        _diagonal_view(value)
