"""An in-place op with no DTensor rule, run replicated on a self that arrives split, keeps
self a consistent DTensor: its layout as it came, its local shard the size its spec says
(``nn.Hardswish(inplace=True)`` after a module boundary that split its input: timm's
MobileNetV3 and EfficientViT failed in the next op, "Expected cond to be True")."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides, replicated_in_place

aten = torch.ops.aten
IN_PLACE_NO_RULE = aten.hardswish_.default  # no DTensor rule on torch 2.13 nor 2.14


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def _consistent(value) -> bool:
    """The local shard has the shape the DTensor's spec gives rank 0."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, _ = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    return tuple(value._local_tensor.shape) == tuple(shape)


def test_only_in_place_ops_that_write_self():
    assert replicated_in_place.applies_to(IN_PLACE_NO_RULE)
    assert not replicated_in_place.applies_to(aten.hardswish.default)
    assert not replicated_in_place.applies_to(aten.add.Tensor)


@pytest.mark.parametrize("placements", [(Shard(3), Shard(2)), (Replicate(), Shard(0)), (Replicate(), Replicate())])
def test_a_planned_fallback_keeps_self_as_it_arrived(mesh, placements):
    whole = torch.randn(8, 8, 16, 16)
    value = distribute_tensor(whole.clone(), mesh, list(placements))
    with overrides.installed(fallback_ops=[IN_PLACE_NO_RULE]), overrides.planned_step():
        out = F.hardswish(value, inplace=True)
    assert out is value
    assert tuple(value.placements) == placements
    assert _consistent(value)
    # A fake process group moves no data: values are checked where self arrives whole.
    if all(p.is_replicate() for p in placements):
        torch.testing.assert_close(value._local_tensor, F.hardswish(whole))


def test_an_unplanned_in_place_op_is_handled_from_its_next_call_on(mesh):
    value = distribute_tensor(torch.randn(8, 8, 16, 16), mesh, [Shard(3), Shard(2)])
    overrides._unplanned_warned.discard(IN_PLACE_NO_RULE)
    with overrides.installed(), overrides.planned_step(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.hardswish(value.clone(), inplace=True)  # the first meeting adds the rule and the handler
        F.hardswish(value, inplace=True)
    assert tuple(value.placements) == (Shard(3), Shard(2))
    assert _consistent(value)


def test_the_handler_is_gone_with_the_overrides(mesh):
    handlers = torch.distributed.tensor.DTensor._op_dispatcher._custom_op_handlers
    with overrides.installed(fallback_ops=[IN_PLACE_NO_RULE]):
        assert handlers.get(IN_PLACE_NO_RULE) is replicated_in_place.handler
    assert IN_PLACE_NO_RULE not in handlers
