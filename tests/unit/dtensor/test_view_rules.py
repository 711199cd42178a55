"""Reshapes stay in the planner's vocabulary (``dtensor/view_rules.py``): flattening a dim split on
one axis behind a dim split on another gathers the later one's axis, as the plan prices it,
instead of making a ``_StridedShard``. (Numerics: ``tests/integration/zoo/test_train_example.py`` trains the
tiny Llama, whose attention does this, on 8 gloo processes.)"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.dtensor.overrides import installed
from autoplan.verify.observe import CollectiveCounter


@pytest.fixture
def mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    with installed():
        yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


def test_flattening_a_split_heads_dim_gathers_it(mesh):
    # (batch, heads, seq, head_dim): heads split on dp, batch on tp, as attention's q/k/v
    value = distribute_tensor(torch.randn(8, 4, 32, 16), mesh, [Shard(1), Shard(0)])
    with CollectiveCounter(torch.nn.Linear(1, 1), mesh) as counter:
        flat = value.reshape(32, 32, 16)  # (batch * heads, seq, head_dim), as matmul does
        view = value.view(32, 32, 16)
    assert tuple(flat.placements) == tuple(view.placements) == (Replicate(), Shard(0))
    local = 8 * 4 * 32 * 16 * 4 // 4  # gathered over dp, still split over tp
    assert counter.table()["<root>"] == {"dp": {"all_gather": {"count": 2, "bytes": 2 * local}}}


def test_a_flatten_that_keeps_its_shard_is_left_alone(mesh):
    value = distribute_tensor(torch.randn(8, 4, 32, 16), mesh, [Shard(0), Shard(2)])
    with CollectiveCounter(torch.nn.Linear(1, 1), mesh) as counter:
        flat = value.reshape(32, 32, 16)
    assert tuple(flat.placements) == (Shard(0), Shard(1))
    assert not counter.collectives


def test_an_unflatten_the_axis_cannot_split_gathers_that_axis(mesh):
    # nn.MultiheadAttention's packed projection, (batch, seq, 3 * E) split by columns on tp,
    # unflattened to (batch, seq, 3, E): 3 is no multiple of tp's 4, and DTensor refuses the view
    value = distribute_tensor(torch.randn(8, 4, 3 * 16), mesh, [Shard(0), Shard(2)])
    with CollectiveCounter(torch.nn.Linear(1, 1), mesh) as counter:
        unflattened = value.view(8, 4, 3, 16)
    assert tuple(unflattened.placements) == (Shard(0), Replicate())
    local = 8 * 4 * 3 * 16 * 4 // 2  # gathered over tp, still split over dp
    assert counter.table()["<root>"] == {"tp": {"all_gather": {"count": 1, "bytes": local}}}
    assert torch.equal(unflattened.full_tensor(), value.full_tensor().view(8, 4, 3, 16))


def test_without_the_overrides_dtensor_refuses_that_unflatten():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        value = distribute_tensor(torch.randn(8, 4, 3 * 16), mesh, [Shard(0), Shard(2)])
        with pytest.raises(RuntimeError, match="Cannot unflatten unevenly sharded tensor"):
            value.view(8, 4, 3, 16)
    finally:
        dist.destroy_process_group()
