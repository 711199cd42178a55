"""Communication time: alpha-beta per collective, per mesh axis, with nccl-tests bus factors.

    time(kind, bytes, n) = latency + factor(kind, n) * bytes / bus_bandwidth
    factor(all_reduce) = 2(n-1)/n ; factor(all_gather | reduce_scatter | all_to_all) = (n-1)/n

``bytes`` is the size of the whole buffer as nccl-tests count it: the gathered output for
all_gather, the full input for reduce_scatter, the buffer for all_reduce and all_to_all.

A mesh is laid out row-major over global ranks, nodes holding consecutive ranks; an axis
whose groups fit in one node talks over the intra-node link, otherwise inter-node. A
profile calibrated on the planning mesh's very shape carries a cost per axis (its
``axes`` table), measured where the plan will run; that table wins over the link table.

Redistribution between two specs is priced the way DTensor performs it: one mesh axis
at a time, in the order of DTensor's own planner (``transform_steps``), each step moving
the tensor as the steps before it left it. Per step on an axis:

    S(i) -> R or P     all_gather (the gathered size)
    P -> R             all_reduce
    P -> S(i)          reduce_scatter
    S(i) -> S(j)       all_to_all (DTensor on a CPU mesh does it as an all_gather)
    R -> S(i), R -> P  free (a slice, a zero-fill)

A spec that splits one dim over several axes (a parameter's FSDP storage over a
tensor-parallel split, ``_S(d, k)``) is moved in the steps DTensor's own planner
(``_gen_transform_infos``) chooses; the order of those steps depends on how the
splits nest, which DTensor knows and this module does not restate. The planner weighs
its paths by the tensor's sizes: a (50257, 64) output head's gradient, partial on tp and
stored ``(_S(1, 4), S(1))`` on 2x4, is first sliced by rows on dp, reduce-scattered on
tp at half the size, and all-to-all'ed to its storage on dp, where a small one is
reduce-scattered whole and sliced. The prediction of a plan's collectives asks it with
each value's real shape (``shape``), and counts rank 0's bytes, whose share of a dim that
does not divide evenly is the larger one; the cost stage asks once per pair of layouts,
on a stand-in whose every dim divides by the mesh (asking per tensor made planning a
Qwen2-MoE a third slower).

A value that carries a gradient has it sent back from ``dst`` to ``src`` the same way.
The gradient reduction a consumer causes when it splits work over an axis on which one
of its inputs is replicated is priced by the cost stage, not here.
"""

from __future__ import annotations

import math
from functools import cache

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._redistribute import _gen_transform_infos

from autoplan.cost.profile import ClusterProfile, LinkCost
from autoplan.placements import (
    REPLICATE,
    Spec,
    is_partial,
    is_shard,
    runtime_placements,
    runtime_spec,
    shard_dim,
    shard_factor,
    strided_factor,
)


def axis_link(mesh_shape: tuple[int, ...], axis: int, devices_per_node: int) -> str:
    stride = math.prod(mesh_shape[axis + 1:])
    return "intra_node" if stride * mesh_shape[axis] <= devices_per_node else "inter_node"


def collective_seconds(profile: ClusterProfile, kind: str, nbytes: float, mesh_shape: tuple[int, ...], axis: int) -> float:
    n = mesh_shape[axis]
    if n == 1 or nbytes <= 0:
        return 0.0
    cost = link_cost(profile, kind, mesh_shape, axis)
    return cost.latency_s + bus_factor(kind, n) * nbytes / cost.bus_bandwidth_bytes_per_s


def calls_seconds(profile: ClusterProfile, kind: str, count: int, nbytes: float, mesh_shape: tuple[int, ...],
                  axes: tuple[int, ...]) -> float:
    """``count`` calls of ``kind`` moving ``nbytes`` in all over ``axes`` (exact for a sum of
    calls). Several axes: DTensor reduces over adjacent axes flattened into one group; each
    call pays the latency of its slowest link, the bytes cross that link's bandwidth with
    the bus factor of the whole group."""
    n = math.prod(mesh_shape[a] for a in axes)
    if n == 1 or nbytes <= 0 or count <= 0:
        return 0.0
    links = [link_cost(profile, kind, mesh_shape, a) for a in axes if mesh_shape[a] > 1]
    latency = max(link.latency_s for link in links)
    bandwidth = min(link.bus_bandwidth_bytes_per_s for link in links)
    return count * latency + bus_factor(kind, n) * nbytes / bandwidth


def table_seconds(table: dict, profile: ClusterProfile, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> float:
    """The time of a plan's collective table (module -> axis -> kind -> {"count", "bytes"},
    or axis -> kind -> ... summed over modules); an axis named "dp+tp" is those axes flattened."""
    index = {name: i for i, name in enumerate(axis_names)}
    per_module = any("count" not in inner for value in table.values() for inner in value.values())
    total = 0.0
    for per_axis in (table.values() if per_module else [table]):
        for axis, per_kind in per_axis.items():
            axes = tuple(index[name] for name in axis.split("+"))
            for kind, entry in per_kind.items():
                total += calls_seconds(profile, kind, entry["count"], entry["bytes"], tuple(mesh_shape), axes)
    return total


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests bus factor: the share of the buffer each rank sends over its link."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def link_cost(profile: ClusterProfile, kind: str, mesh_shape: tuple[int, ...], axis: int) -> LinkCost:
    """The measured cost of ``axis`` if the profile was calibrated on this mesh shape, else its link's."""
    per_axis = profile.axes.get(tuple(mesh_shape))
    if per_axis is not None:
        return per_axis[axis][kind]
    return profile.links[axis_link(mesh_shape, axis, profile.devices_per_node)][kind]


def transform_steps(src: Spec, dst: Spec, mesh_shape: tuple[int, ...]) -> list[tuple[int, str, str]]:
    """The per-axis steps ``(axis, from, to)`` DTensor takes from ``src`` to ``dst``, in its
    order (torch 2.13's greedy redistribute planner): when anything is sharded, first the
    axes from innermost to outermost, going through Replicate where a target shard would
    nest differently under the axes before it; then, outermost first, what is left.
    The order matters: each step moves the tensor as the steps before it left it.
    Where a dim is split over several axes, DTensor's planner is asked."""
    if splits_a_dim_twice(src) or splits_a_dim_twice(dst):
        return list(_dtensor_steps(tuple(src), tuple(dst), tuple(mesh_shape)))
    current, target = list(src), list(dst)
    steps = []
    if any(is_shard(p) for p in current):
        for axis in reversed(range(len(current))):
            goal = target[axis]
            if is_shard(goal):  # same tensor dim sharded over other axes before this one?
                before = [i for i in range(axis) if current[i] == goal]
                wanted = [i for i in range(axis) if target[i] == goal]
                if before != wanted:
                    goal = REPLICATE
            if current[axis] != goal:
                steps.append((axis, current[axis], goal))
                current[axis] = goal
    for axis, goal in enumerate(target):
        if current[axis] != goal:
            steps.append((axis, current[axis], goal))
            current[axis] = goal
    return steps


def splits_a_dim_twice(spec: Spec) -> bool:
    dims = [shard_dim(p) for p in spec if is_shard(p)]
    return len(set(dims)) < len(dims) or any(strided_factor(p) for p in spec)


_DTYPE_OF_SIZE = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}
"""A dtype of each element size, for DTensor's redistribute planner (which prices bytes)."""


@cache
def _dtensor_steps(
    src: Spec, dst: Spec, mesh_shape: tuple[int, ...], shape: tuple[int, ...] | None = None, item_bytes: int = 4
) -> tuple[tuple[int, str, str], ...]:
    """DTensor's own plan for the move of a tensor of ``shape`` (default: one whose every
    dim divides by the whole mesh) whose elements take ``item_bytes``: DTensor prices its
    paths in bytes, so the path can depend on the dtype (a gradient partial on tp going
    back to a weight stored split twice by one dim: in float32 DTensor reduce-scatters half
    of it and swaps the dp split, in bfloat16 it reduce-scatters it whole and slices)."""
    from autoplan.choices.graph import planning_mesh  # the cost stage runs after choices

    mesh = planning_mesh(mesh_shape, tuple(f"axis{i}" for i in range(len(mesh_shape))))
    ndim = 1 + max([d for p in (*src, *dst) if (d := shard_dim(p)) is not None], default=0)
    shape = torch.Size(shape if shape is not None else [math.prod(mesh_shape)] * ndim)
    dtype = _DTYPE_OF_SIZE.get(item_bytes, torch.float32)
    meta = TensorMeta(shape, torch.empty(shape, device="meta").stride(), dtype)
    infos = _gen_transform_infos(
        DTensorSpec(mesh, runtime_placements(src), tensor_meta=meta),
        DTensorSpec(mesh, runtime_placements(dst), tensor_meta=meta),
    )
    steps = []
    for info in infos:
        before, after = runtime_spec(info.src_dst_placements)
        steps.append((info.mesh_dim, before, after))
    return tuple(steps)


def redistribute_collectives(
    src: Spec,
    dst: Spec,
    global_bytes: float,
    mesh_shape: tuple[int, ...],
    backward: bool,
    shape: tuple[int, ...] | None = None,
) -> list[tuple[str, int, float, str]]:
    """The collectives that move a tensor from ``src`` to ``dst`` (and, if ``backward``, its
    gradient back): ``(kind, axis, bytes, "forward" | "backward")``.

    The gradient goes back the way ``Redistribute``'s backward takes it: from ``dst`` to
    ``src``, a partial placement on either side standing for Replicate (the gradient of a
    partial value is replicated, and a gradient is never made partial). ``shape``: the
    tensor's, where known (see the module doc)."""
    found = [(kind, axis, nbytes, "forward") for kind, axis, nbytes in _moves(src, dst, global_bytes, mesh_shape, shape)]
    if backward:
        grad = without_partial(dst)
        back = gradient_collectives(grad, src, global_bytes, mesh_shape, shape)
        found += [(kind, axis, nbytes, "backward") for kind, axis, nbytes in back]
    return found


def gradient_collectives(
    grad: Spec, src: Spec, global_bytes: float, mesh_shape: tuple[int, ...], shape: tuple[int, ...] | None = None
) -> list[tuple[str, int, float]]:
    """``(kind, axis, bytes)`` that bring a gradient laid out as ``grad`` (partial where the
    reader split its work over a replicated input) back to the value's layout ``src``: a
    ``Redistribute``'s backward, in DTensor's order of axes."""
    return _moves(grad, without_partial(src), global_bytes, mesh_shape, shape)


def without_partial(spec: Spec) -> Spec:
    """``spec`` with every partial placement replicated: the layout of a partial value's
    gradient, or of a partial value once reduced."""
    return tuple(REPLICATE if is_partial(p) else p for p in spec)


def moves_locally(src: Spec, dst: Spec) -> bool:
    """Whether DTensor moves ``src`` to ``dst`` without communicating: unchanged, or
    sliced (Replicate to Shard)."""
    return all(a == b or (a == REPLICATE and is_shard(b)) for a, b in zip(src, dst))


def _moves(
    src: Spec, dst: Spec, global_bytes: float, mesh_shape: tuple[int, ...], shape: tuple[int, ...] | None = None
) -> list[tuple[str, int, float]]:
    several = bool(shape) and (splits_a_dim_twice(src) or splits_a_dim_twice(dst))
    if several and shape:
        item_bytes = global_bytes / max(1, math.prod(shape))
        steps = list(_dtensor_steps(tuple(src), tuple(dst), tuple(mesh_shape), tuple(shape), round(item_bytes)))
    else:
        steps = transform_steps(src, dst, mesh_shape)
    current = list(src)
    found = []
    for axis, before_placement, target in steps:
        kind, size = _step_collective(before_placement, target)
        if kind and mesh_shape[axis] > 1:
            if several:  # rank 0's share, the larger one of an uneven split (padded to scatter)
                scattered = shard_dim(target) if kind == "reduce_scatter" else None
                before = item_bytes * _first_share(shape, current, mesh_shape, scattered, axis)
            else:
                before = global_bytes / shard_factor(tuple(current), mesh_shape)
            found.append((kind, axis, before * mesh_shape[axis] if size == "after" else before))
        current[axis] = target
    return found


def _first_share(shape, spec, mesh_shape, scattered: int | None = None, axis: int = 0) -> int:
    """Elements of rank 0's share of a tensor of ``shape`` laid out as ``spec``: each split
    dim cut into ceiling-sized chunks, axis after axis. ``scattered``: a dim about to be
    reduce-scattered over ``axis``, padded to a multiple of that axis (as DTensor pads it)."""
    sizes = list(shape)
    for placement, n in zip(spec, mesh_shape):
        dim = shard_dim(placement)
        if dim is not None:
            sizes[dim] = -(-sizes[dim] // n)
    if scattered is not None:
        n = mesh_shape[axis]
        sizes[scattered] = -(-sizes[scattered] // n) * n
    return math.prod(sizes)


def _step_collective(src: str, dst: str) -> tuple[str | None, str]:
    """(collective, which size it moves) for one step on one axis."""
    if is_partial(src) and is_partial(dst):
        return None, ""
    if is_shard(src) and (dst == REPLICATE or is_partial(dst)):
        return "all_gather", "after"
    if is_partial(src) and dst == REPLICATE:
        return "all_reduce", "before"
    if is_partial(src) and is_shard(dst):
        return "reduce_scatter", "before"
    if is_shard(src) and is_shard(dst):
        return "all_to_all", "before"
    return None, ""  # R -> S (a slice), R -> P


def redistribute_seconds(
    profile: ClusterProfile,
    src: Spec,
    dst: Spec,
    global_bytes: float,
    mesh_shape: tuple[int, ...],
    backward: bool,
) -> float:
    """Time to move a tensor from ``src`` to ``dst`` (and, if ``backward``, its gradient back)."""
    return sum(
        collective_seconds(profile, kind, nbytes, mesh_shape, axis)
        for kind, axis, nbytes, _ in redistribute_collectives(src, dst, global_bytes, mesh_shape, backward)
    )
