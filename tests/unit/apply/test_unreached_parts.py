"""A split whose parts the loss does not all reach trains on DTensors
(``autoplan/apply/unreached_parts.py``): autograd's zeros for the unreached parts are
plain tensors, which DTensor's ``cat`` refused beside the other parts' gradients."""

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.apply.engine import plan_execution


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


SPLITS = {
    "split": lambda x: x.split([1, 4], dim=1)[0],
    "torch.split": lambda x: torch.split(x, 2, 1)[1],
    "chunk": lambda x: x.chunk(5, 1)[2],
    "unbind": lambda x: x.unbind(1)[0],
    "tensor_split": lambda x: torch.tensor_split(x, [3], dim=1)[1],
}


def _whole():
    torch.manual_seed(0)
    return torch.randn(8, 5, 4)


@pytest.mark.parametrize("name", SPLITS)
def test_a_part_the_loss_never_reads_gets_zeros_laid_out_as_it(mesh, name):
    take = SPLITS[name]
    x = distribute_tensor(_whole(), mesh, [Shard(0), Replicate()]).requires_grad_()
    with plan_execution(mesh):  # the forward, as a planned model runs it
        loss = (take(x) ** 2).sum()
    loss.backward()  # the user's backward, outside it

    expected = _whole().requires_grad_()
    (take(expected) ** 2).sum().backward()
    assert x.grad.placements == x.placements
    # this process is rank 0 of a fake process group: its shard is the first half of the batch
    assert torch.equal(x.grad.to_local(), expected.grad[:4])
    assert x.grad.to_local().abs().sum() > 0


def test_without_it_dtensor_refuses_the_backward(mesh):
    x = distribute_tensor(_whole(), mesh, [Shard(0), Replicate()]).requires_grad_()
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        x.split([1, 4], dim=1)[0].sum().backward()
