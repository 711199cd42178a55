"""Communication time: alpha-beta per collective, per mesh axis, with nccl-tests bus factors.

    time(kind, bytes, n) = latency + factor(kind, n) * bytes / bus_bandwidth
    factor(all_reduce) = 2(n-1)/n ; factor(all_gather | reduce_scatter | all_to_all) = (n-1)/n

``bytes`` is the size of the whole buffer as nccl-tests count it: the gathered output for
all_gather, the full input for reduce_scatter, the buffer for all_reduce and all_to_all.

A mesh is laid out row-major over global ranks, nodes holding consecutive ranks; an axis
whose groups fit in one node talks over the intra-node link, otherwise inter-node. A
profile calibrated on the planning mesh's very shape carries a cost per axis (its
``axes`` table), measured where the plan will run; that table wins over the link table.

Redistribution between two specs is priced the way DTensor performs it, one mesh axis
at a time. The table below gives the forward collective for each transition on an axis,
and the one its backward (the gradient flowing the other way) needs:

    src -> dst         forward          backward
    S(i) -> R          all_gather       (slice, free)
    P -> R             all_reduce       (free)
    P -> S(i)          reduce_scatter   all_gather
    R -> S(i)          (slice, free)    all_gather
    S(i) -> S(j)       all_to_all       all_to_all
    S(i) -> P          all_gather       (free)
    R -> P             (free)           (free)

The gradient reduction a consumer causes when it splits work over an axis on which one
of its inputs is replicated is priced by the cost stage, not here.
"""

from __future__ import annotations

import math

from autoplan.placements import Spec, is_partial, is_shard, shard_factor
from autoplan.profile import ClusterProfile, LinkCost


def axis_link(mesh_shape: tuple[int, ...], axis: int, devices_per_node: int) -> str:
    stride = math.prod(mesh_shape[axis + 1:])
    return "intra_node" if stride * mesh_shape[axis] <= devices_per_node else "inter_node"


def collective_seconds(profile: ClusterProfile, kind: str, nbytes: float, mesh_shape: tuple[int, ...], axis: int) -> float:
    n = mesh_shape[axis]
    if n == 1 or nbytes <= 0:
        return 0.0
    cost = link_cost(profile, kind, mesh_shape, axis)
    return cost.latency_s + bus_factor(kind, n) * nbytes / cost.bus_bandwidth_bytes_per_s


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests bus factor: the share of the buffer each rank sends over its link."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def link_cost(profile: ClusterProfile, kind: str, mesh_shape: tuple[int, ...], axis: int) -> LinkCost:
    """The measured cost of ``axis`` if the profile was calibrated on this mesh shape, else its link's."""
    per_axis = profile.axes.get(tuple(mesh_shape))
    if per_axis is not None:
        return per_axis[axis][kind]
    return profile.links[axis_link(mesh_shape, axis, profile.devices_per_node)][kind]


def _transition(src: str, dst: str) -> tuple[str | None, str | None, str]:
    """(forward collective, backward collective, which size they move) for one axis."""
    if src == dst or (is_partial(src) and is_partial(dst)):
        return None, None, ""
    if is_shard(src) and dst == "R":
        return "all_gather", None, "after"
    if is_partial(src) and dst == "R":
        return "all_reduce", None, "before"
    if is_partial(src) and is_shard(dst):
        return "reduce_scatter", "all_gather", "before"
    if src == "R" and is_shard(dst):
        return None, "all_gather", "before"
    if is_shard(src) and is_shard(dst):
        return "all_to_all", "all_to_all", "before"
    if is_shard(src) and is_partial(dst):
        return "all_gather", None, "after"
    return None, None, ""  # R -> P


def redistribute_seconds(
    profile: ClusterProfile,
    src: Spec,
    dst: Spec,
    global_bytes: float,
    mesh_shape: tuple[int, ...],
    backward: bool,
) -> float:
    """Time to move a tensor from ``src`` to ``dst`` (and, if ``backward``, its gradient back)."""
    current = list(src)
    total = 0.0
    for axis, target in enumerate(dst):
        forward_kind, backward_kind, size = _transition(current[axis], target)
        if forward_kind or (backward and backward_kind):
            before = global_bytes / shard_factor(tuple(current), mesh_shape)
            nbytes = before * mesh_shape[axis] if size == "after" else before
            if forward_kind:
                total += collective_seconds(profile, forward_kind, nbytes, mesh_shape, axis)
            if backward and backward_kind:
                total += collective_seconds(profile, backward_kind, nbytes, mesh_shape, axis)
        current[axis] = target
    return total
