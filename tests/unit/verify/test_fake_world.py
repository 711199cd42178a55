"""The fake world a dry run counts a plan's step on: shard-to-shard moves as the devices run them."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor, placement_types

from autoplan.verify.fake_world import fake_world
from autoplan.verify.observe import CollectiveCounter
from autoplan.verify.step_check import as_on_cpu

SHAPE, NAMES = (2, 4), ("dp", "tp")


def _move_to_other_dim(as_on_devices: bool) -> dict:
    """The table of one (16, 8) float32 tensor moved from rows to columns on tp, rows on dp."""
    with fake_world(SHAPE, NAMES, as_on_devices=as_on_devices) as mesh:
        value = distribute_tensor(torch.ones(16, 8), mesh, [Shard(0), Shard(0)])
        with CollectiveCounter(nn.Module(), mesh) as counter:
            value.redistribute(mesh, [Shard(0), Shard(1)])
        return counter.table()


def test_a_dry_run_counts_the_devices_all_to_all_and_verify_translates_it_to_the_cpu_gather():
    local = 16 // 8 * 8 * 4  # rank 0's (2, 8) float32 rows before the move
    on_devices = _move_to_other_dim(as_on_devices=True)
    assert on_devices == {"<root>": {"tp": {"all_to_all": {"count": 1, "bytes": local}}}}
    on_cpu = _move_to_other_dim(as_on_devices=False)
    assert on_cpu == {"<root>": {"tp": {"all_gather": {"count": 1, "bytes": 4 * local}}}}
    assert as_on_cpu(on_devices, dict(zip(NAMES, SHAPE))) == on_cpu


def test_dtensor_is_as_it_was_after_the_fake_world_even_when_the_step_fails():
    own = placement_types.shard_dim_alltoall
    with pytest.raises(RuntimeError, match="the step failed"), fake_world(SHAPE, NAMES, as_on_devices=True):
        assert placement_types.shard_dim_alltoall is not own
        raise RuntimeError("the step failed")
    assert placement_types.shard_dim_alltoall is own
    assert not logging.getLogger("torch.distributed.tensor._redistribute").filters


def test_dtensor_advice_about_the_fake_step_is_not_logged_there_and_is_logged_after(caplog):
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        with fake_world(SHAPE, NAMES, as_on_devices=True):
            logger.warning("2 sequential all_reduce operations")
        assert not caplog.records
        logger.warning("2 sequential all_reduce operations")
        assert [r.getMessage() for r in caplog.records] == ["2 sequential all_reduce operations"]
