"""A module called with one tensor in several argument positions (Funnel's attention takes
its hidden states as query, key and value) has it moved to the planned layout once: the
plan prices one move of the value, and its gradients, summed, go back once."""

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

from autoplan.apply.engine import _redistribute_tree


def test_one_tensor_in_three_positions_is_gathered_once(fake_mesh_2x4):
    mesh = fake_mesh_2x4
    hidden = DTensor.from_local(torch.ones(2, 8, 16, requires_grad=True), mesh, [Replicate(), Shard(0)])
    whole = (Replicate(), Replicate())
    layouts = {"[0][0]": whole, "[0][1]": whole, "[0][2]": whole}

    with CommDebugMode() as comms:
        (query, key, value), _ = _redistribute_tree(((hidden, hidden, hidden), {}), layouts, mesh)
    assert comms.get_total_counts() == 1
    assert query is key is value and tuple(query.placements) == whole

    with CommDebugMode() as comms:
        (query + 2 * key + 3 * value).sum().backward()
    assert comms.get_total_counts() <= 1  # the summed gradient goes back to the split once


def test_one_tensor_laid_out_two_ways_is_moved_for_each(fake_mesh_2x4):
    mesh = fake_mesh_2x4
    hidden = DTensor.from_local(torch.ones(2, 8, 16), mesh, [Replicate(), Shard(0)])
    layouts = {"[0][0]": (Replicate(), Replicate()), "[0][1]": (Replicate(), Shard(1))}

    (whole, split), _ = _redistribute_tree(((hidden, hidden), {}), layouts, mesh)
    assert tuple(whole.placements) == (Replicate(), Replicate())
    assert tuple(split.placements) == (Replicate(), Shard(1))
