"""A fill with zeros keeps a partial value partial (``autoplan/dtensor/zero_fill.py``):
the backward of ``std`` zeroes its partial gradient in place, which DTensor refused."""

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _partial(mesh):
    return DTensor.from_local(torch.randn(2, 5, 1), mesh, [Partial(), Shard(0)], run_check=False)


def test_zeroing_a_partial_value_keeps_it_partial_in_place_or_not(mesh):
    mask = DTensor.from_local(torch.rand(2, 5, 1) > 0.5, mesh, [Replicate(), Shard(0)], run_check=False)
    with overrides.installed():
        assert _partial(mesh).masked_fill_(mask, 0).placements == (Partial(), Shard(0))
        assert _partial(mesh).masked_fill(mask, 0.0).placements == (Partial(), Shard(0))
        with pytest.raises(RuntimeError, match="in-place operations that require placement changes"):
            _partial(mesh).masked_fill_(mask, 1.0)  # another value would be summed over the ranks


def test_the_backward_of_std_takes_a_partial_gradient(mesh):
    """Gemma3n's MLP cuts its gate at ``mean + std * k`` over the intermediate dim, split on
    dp: the cut's gradient, summed over that dim, reached ``std``'s backward partial on dp,
    and its ``masked_fill_`` failed."""
    gate = distribute_tensor(torch.randn(8, 5, 16), mesh, [Shard(2), Shard(0)]).requires_grad_()
    with overrides.installed():
        spread = gate.std(-1, keepdim=True, unbiased=False)
        spread.backward(_partial(mesh))
    assert gate.grad.shape == gate.shape
