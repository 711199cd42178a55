"""The fake process group a plan's step runs on inside this process (a dry run, ``verify``).

One process stands for every rank of the plan's mesh (rank 0): collectives move no data, so
a step on fake tensors costs seconds at any width. The mesh is a CPU mesh, and on a CPU mesh
DTensor moves a split to another dim as an all_gather and a chunk (gloo has no all_to_all),
where the devices a plan is made for run one all_to_all. ``as_on_devices`` makes the dry run
count the step the devices run: its table says ``all_to_all`` with the bytes each rank sends,
as the cost stage prices that move, and ``verify`` on a CPU mesh translates the prediction
back (``step_check.as_on_cpu``). Without it the table counted the CPU's all_gather: n times
the bytes, at all_gather's price, for every such move of a plan made for GPUs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.dtensor.overrides import forget_decisions

_ADVICE_LOGGERS = ("torch.distributed.tensor._redistribute", "torch.distributed.tensor._collective_utils")
"""Where DTensor logs advice about the collectives it runs (two sequential all-reduces where a
flattened mesh would do one; a CPU mesh's all_to_all fallback)."""


@contextmanager
def fake_world(mesh_shape, axis_names, as_on_devices: bool = False) -> Iterator[DeviceMesh]:
    """A fake process group of ``mesh_shape``'s world size (this process is rank 0) and its mesh,
    for the ``with`` body; afterwards the sharding decisions cached on that mesh are
    forgotten (they are no answers for a later one). ``as_on_devices``: DTensor's
    shard-to-shard moves run as on a device mesh (see the module docstring), and DTensor's
    advice about this fake step's collectives is not logged: it speaks of a step the user
    does not run."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(mesh_shape))
    try:
        with (_moves_as_on_devices() if as_on_devices else nullcontext()), \
                (_advice_unlogged() if as_on_devices else nullcontext()):
            yield init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=tuple(axis_names))
    finally:
        dist.destroy_process_group()
        forget_decisions()


def _device_all_to_all(input, gather_dim: int, shard_dim: int, mesh: DeviceMesh, mesh_dim: int):
    """DTensor's shard-to-shard move as a device mesh runs it: one all_to_all on the axis."""
    return torch.ops._dtensor.shard_dim_alltoall(input, gather_dim, shard_dim, mesh.get_group(mesh_dim).group_name)


@contextmanager
def _moves_as_on_devices() -> Iterator[None]:
    """For the ``with`` body only (a dry run in this thread, on the fake world): DTensor's
    placement code calls the device path of its shard-to-shard move. torch chooses between
    the two paths by the mesh's device type inside that one function, so the function is what
    is swapped; it is put back on the way out, whatever happens."""
    from torch.distributed.tensor import placement_types

    own = placement_types.shard_dim_alltoall
    placement_types.shard_dim_alltoall = _device_all_to_all
    try:
        yield
    finally:
        placement_types.shard_dim_alltoall = own


def moves_gathered(mesh: DeviceMesh) -> bool:
    """Whether DTensor on ``mesh`` runs a shard-to-shard move as an all_gather: on a CPU mesh,
    unless inside an ``as_on_devices`` fake world."""
    from torch.distributed.tensor import placement_types

    return mesh.device_type == "cpu" and placement_types.shard_dim_alltoall is not _device_all_to_all


class _DropWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING


@contextmanager
def _advice_unlogged() -> Iterator[None]:
    """DTensor's warnings on its collective loggers are dropped for the ``with`` body (a
    dry run), then the loggers are as they were; errors still pass."""
    drop = _DropWarnings()
    loggers = [logging.getLogger(name) for name in _ADVICE_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)
