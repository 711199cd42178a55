"""DTensor's choice of an op strategy while autoplan's changes are installed
(``autoplan/dtensor/strategy_choice.py``): never a split of a dim its axes do not divide
where an even one exists.

Inkling's looped decoder at a batch of 6 x 15 on 2x4 gathers from its hidden states, split
by hidden on tp, with a whole index: DTensor's cheapest strategy split both by example on
tp (6 examples over 4 ranks: 2, 2, 2 and 0), a layout the planner never offers, and the
backward's flatten of that gradient raised "Cannot flatten unevenly sharded tensor".
"""

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.dtensor import overrides


def test_a_gather_is_not_split_by_six_examples_over_four_ranks(fake_mesh_2x4):
    mesh = fake_mesh_2x4
    hidden = DTensor.from_local(torch.randn(6, 24, 15, 4), mesh, [Replicate(), Shard(3)], run_check=False)
    index = DTensor.from_local(torch.randint(0, 16, (6, 24, 15, 15)), mesh, [Replicate(), Replicate()], run_check=False)
    with overrides.installed():  # first: DTensor's C++ cache would answer a call made without it
        out = torch.gather(hidden, 3, index)
    tp = out.placements[1]
    assert not (isinstance(tp, Shard) and out.shape[tp.dim] % 4), out.placements  # DTensor alone: Shard(0)
    assert out.shape == (6, 24, 15, 15)
    assert out.to_local().shape[0] in (3, 6)  # whole on tp, or split by example on dp only
    out.flatten(0, 2)  # the backward's flatten, which an uneven split refuses
