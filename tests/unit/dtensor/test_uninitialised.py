"""An empty tensor made like a partial one is replicated (``autoplan/dtensor/uninitialised.py``):
a dropout on the CPU fills ``empty_like(x)`` in place with a random mask, which DTensor
refused where ``x`` arrived partial."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from autoplan.dtensor import overrides


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _partial(mesh):
    return DTensor.from_local(torch.randn(2, 5, 4), mesh, [Replicate(), Partial()], run_check=False)


def test_plain_dtensor_refuses_a_dropout_of_a_partial_input(mesh):
    """Why the change exists (on torch 2.13 and 2.14 alike): without autoplan's rules the
    mask is made partial and its in-place fill fails."""
    with pytest.raises(RuntimeError, match="in-place operations that require placement changes"):
        F.dropout(_partial(mesh), 0.5, training=True)


def test_an_empty_tensor_like_a_partial_one_is_replicated_there(mesh):
    sharded = DTensor.from_local(torch.randn(2, 5, 4), mesh, [Shard(0), Partial()], run_check=False)
    with overrides.installed():
        assert torch.empty_like(_partial(mesh)).placements == (Replicate(), Replicate())
        assert torch.empty_like(sharded).placements == (Shard(0), Replicate())


def test_a_dropout_of_a_partial_input_stays_partial_while_installed(mesh):
    """The mask, whole on tp, scales every rank's share alike: the result is still a sum."""
    with overrides.installed():
        dropped = F.dropout(_partial(mesh), 0.5, training=True)
    assert dropped.placements == (Replicate(), Partial())
