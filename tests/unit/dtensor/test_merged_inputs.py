"""The merged layout DTensor is offered (``autoplan/dtensor/merged_inputs.py``) never re-labels
an in-place op's self.

DeepSeek V4's compressor builds a whole bias and scatters zeros into it at indices split
by batch (``block_bias.scatter_(-1, index, 0.0)``). Offered the layout that keeps every
input's split, DTensor ran the op on a slice of the bias and re-labelled the bias split
by batch, its local tensor the whole one, and the attention mask's ``cat`` with it failed
("Sizes of tensors must match except in dimension 3").
"""

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoplan.dtensor import overrides


def test_an_in_place_scatter_keeps_its_whole_self_whole(fake_mesh_2x4):
    mesh = fake_mesh_2x4
    bias = DTensor.from_local(torch.full((8, 1, 16, 5), -1.0), mesh, [Replicate(), Replicate()], run_check=False)
    index = DTensor.from_local(torch.zeros((2, 1, 16, 4), dtype=torch.long), mesh, [Replicate(), Shard(0)], run_check=False)
    with overrides.installed():
        bias.scatter_(-1, index, 0.0)
    assert bias.placements == (Replicate(), Replicate())
    assert bias.to_local().shape == (8, 1, 16, 5)


def test_an_out_of_place_scatter_still_takes_the_merged_layout(fake_mesh_2x4):
    mesh = fake_mesh_2x4
    bias = DTensor.from_local(torch.full((8, 1, 16, 5), -1.0), mesh, [Replicate(), Replicate()], run_check=False)
    index = DTensor.from_local(torch.zeros((2, 1, 16, 4), dtype=torch.long), mesh, [Replicate(), Shard(0)], run_check=False)
    with overrides.installed():
        out = bias.scatter(-1, index, 0.0)
    assert out.placements == (Replicate(), Shard(0))
    assert out.to_local().shape == (2, 1, 16, 5)
