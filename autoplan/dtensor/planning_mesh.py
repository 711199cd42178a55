"""A DeviceMesh to ask DTensor's sharding rules with, apart from any process group.

Its own module because both the choice graph and autoplan's changes to DTensor (which
probe DTensor's rules before they install themselves) ask with it.
"""

from __future__ import annotations

import math

import torch
from torch.distributed.device_mesh import DeviceMesh


def planning_mesh(mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> DeviceMesh:
    """A DeviceMesh for strategy queries only: no process group, no communication."""
    # On the CPU whatever the default device: the first plan of a process may be made under
    # ``torch.device("meta")``, where a rank table could not be read.
    ranks = torch.arange(math.prod(mesh_shape), device="cpu").reshape(mesh_shape)
    return DeviceMesh("cpu", ranks, mesh_dim_names=axis_names, _init_backend=False, _rank=0)
