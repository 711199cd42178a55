"""``pipeline_parallel/microbatch_collectives.microbatch_of``: the batch a prediction's dry
run steps, one microbatch of it, cut as ``Pipelined.step`` cuts it."""

import torch

from autoplan.pipeline_parallel.microbatch_collectives import microbatch_of


def test_tensors_with_the_batch_along_dim_0_are_cut_to_the_first_microbatch():
    batch = {"input_ids": torch.arange(8 * 3).reshape(8, 3), "labels": torch.ones(8, 3), "scale": torch.tensor(2.0),
             "table": torch.zeros(5, 3)}
    micro = microbatch_of(batch, 8, 4)
    assert torch.equal(micro["input_ids"], batch["input_ids"].chunk(4)[0])
    assert micro["labels"].shape == (2, 3)
    assert micro["scale"] is batch["scale"] and micro["table"] is batch["table"]  # not the batch's dim 0: as given


def test_one_microbatch_is_the_batch():
    batch = (torch.ones(6, 2),)
    assert microbatch_of(batch, 6, 1)[0].shape == (6, 2)
