"""Placement vocabulary shared by every stage.

A *spec* is a tuple with one placement string per mesh axis, in DTensor's short
forms: ``"R"`` (replicate), ``"S(d)"`` (shard tensor dim ``d``), ``"P(sum)"``
(partial sum). "axis" always means a mesh axis, "dim" a tensor dimension.

A parameter may be stored with one dim split over several axes (FSDP storage over a
tensor-parallel split). ``["S(0)", "S(0)"]`` is DTensor's default order: the first axis
splits the dim, the next splits each piece again. The other order, torchtitan's FSDP over
TP, is DTensor's ``_StridedShard``, written as DTensor prints it: ``["_S(0, 4)", "S(0)"]``
on a 2x4 mesh: the tp axis (4) splits dim 0 first and the dp axis splits each tp piece.
The factor is always the product of the later axes' sizes that split the same dim.
"""

from __future__ import annotations

import itertools
import math
import re
from functools import cache

from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor._ops._math_ops import _NormPartial
from torch.distributed.tensor.placement_types import _StridedShard

from autoplan.errors import PlanError

Spec = tuple[str, ...]

REPLICATE = "R"
PARTIAL = "P(sum)"
PARTIAL_AVG = "P(avg)"
_SHARD_RE = re.compile(r"^S\((\d+)\)$")
_STRIDED_RE = re.compile(r"^_S\((\d+), ?(\d+)\)$")
_NORM_PARTIAL_RE = re.compile(r"^P\((.+)-norm\)$")


def shard(dim: int) -> str:
    return f"S({dim})"


def strided(dim: int, factor: int) -> str:
    """DTensor's short form of ``_StridedShard(dim, split_factor=factor)``."""
    return f"_S({dim}, {factor})"


@cache  # a handful of distinct strings, asked about millions of times while costing
def shard_dim(placement: str) -> int | None:
    """Tensor dim a ``S(d)`` or ``_S(d, k)`` string shards, else None."""
    match = _SHARD_RE.match(placement) or _STRIDED_RE.match(placement)
    return int(match.group(1)) if match else None


def is_strided(placement: str) -> bool:
    return strided_factor(placement) is not None


@cache
def strided_factor(placement: str) -> int | None:
    """The split factor of a ``_S(d, k)`` string, else None."""
    match = _STRIDED_RE.match(placement)
    return int(match.group(2)) if match else None


def is_shard(placement: str) -> bool:
    return shard_dim(placement) is not None


def is_partial(placement: str) -> bool:
    return placement.startswith("P(")


def to_string(placement: Placement) -> str:
    if isinstance(placement, Replicate):
        return REPLICATE
    if isinstance(placement, Shard) and type(placement) is Shard:
        return shard(placement.dim)
    if isinstance(placement, _StridedShard):
        return strided(placement.dim, int(placement.split_factor))
    if type(placement) is Partial and placement.reduce_op in ("sum", "avg"):
        return f"P({placement.reduce_op})"
    raise ValueError(f"expected R, S(d), _S(d, k) or P(sum), got {placement!r}")


def to_placement(text: str) -> Placement:
    if text == REPLICATE:
        return Replicate()
    if text in (PARTIAL, PARTIAL_AVG):
        return Partial(text[2:-1])
    factor, dim = strided_factor(text), shard_dim(text)
    if factor is not None and dim is not None:
        return _StridedShard(dim, split_factor=factor)
    if dim is not None:
        return Shard(dim)
    raise PlanError(
        f"unknown placement {text!r}",
        hint='use "R", "S(<dim>)", "_S(<dim>, <factor>)" or "P(sum)", one per mesh axis',
    )


def to_placements(spec: Spec) -> tuple[Placement, ...]:
    return tuple(to_placement(p) for p in spec)


def spec_from_placements(placements) -> Spec:
    return tuple(to_string(p) for p in placements)


def runtime_spec(placements) -> Spec:
    """``spec_from_placements``, naming also the placement that only DTensor's own rules make,
    at run time: a vector norm over a split dim leaves each rank the norm of its share,
    ``"P(2-norm)"``, which the next op reads reduced (an all_reduce, like a partial sum's).
    The planner never chooses it: DTensor makes it where a value arrives split that the plan
    would have gathered for the norm (SwiftFormer's ``normalize`` of its query)."""
    return tuple(f"P({p.norm_type:g}-norm)" if isinstance(p, _NormPartial) else to_string(p) for p in placements)


def runtime_placements(spec: Spec) -> tuple[Placement, ...]:
    """DTensor's placements of a spec ``runtime_spec`` made."""
    return tuple(_norm_partial(p) if _NORM_PARTIAL_RE.match(p) else to_placement(p) for p in spec)


def _norm_partial(text: str) -> Placement:
    match = _NORM_PARTIAL_RE.match(text)
    assert match is not None, text  # the caller matched it
    return _NormPartial(norm_type=float(match.group(1)))


def replicated(mesh_ndim: int) -> Spec:
    return (REPLICATE,) * mesh_ndim


def shard_factor(spec: Spec, mesh_shape: tuple[int, ...]) -> int:
    """How many pieces a tensor with ``spec`` is cut into (its local share is 1/factor)."""
    factor = 1
    for placement, size in zip(spec, mesh_shape):
        if is_shard(placement):
            factor *= size
    return factor


def fits_evenly(spec: Spec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], several_axes: bool = False) -> bool:
    """True when each sharded dim divides evenly by the axes that shard it, and is sharded
    by one axis only unless ``several_axes`` (a parameter's storage, see the module doc).

    One axis per dim for values ops compute: DTensor (torch 2.13) represents a dim sharded
    over two axes with ``_StridedShard`` after views, and fails to propagate it through
    later reshapes. A stored parameter is only ever moved to the layout its reader needs.
    """
    return layout_problem(spec, shape, mesh_shape, several_axes) is None


def layout_problem(spec: Spec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], several_axes: bool) -> str | None:
    """Why ``spec`` cannot lay out a tensor of ``shape`` evenly (see ``fits_evenly``), else None."""
    split: dict[int, int] = {}
    for axis, (placement, size) in enumerate(zip(spec, mesh_shape)):
        dim = shard_dim(placement)
        if dim is None:
            continue
        if dim >= len(shape):
            return f"it has {len(shape)} dims, {placement} shards dim {dim}"
        if dim in split and not several_axes:
            return f"dim {dim} is sharded on two mesh axes; a value ops compute is split on one"
        factor = strided_factor(placement)
        if factor is not None:
            later = math.prod(n for p, n in zip(spec[axis + 1:], mesh_shape[axis + 1:]) if shard_dim(p) == dim)
            if not several_axes or factor != later or later == 1:
                return (f"{placement} must be followed by axes that split dim {dim} {factor} ways"
                        f" (they split it {later} ways)")
        split[dim] = split.get(dim, 1) * size
        if shape[dim] % split[dim]:
            return f"dim {dim} ({shape[dim]}) does not divide into {split[dim]} pieces"
    return None


def local_shape(shape: tuple[int, ...], spec: Spec, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    out = list(shape)
    for placement, size in zip(spec, mesh_shape):
        dim = shard_dim(placement)
        if dim is not None:
            out[dim] //= size
    return tuple(out)


def format_spec(spec: Spec) -> str:
    return "[" + ", ".join(spec) + "]"


def candidate_specs(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], partial: bool, several_axes: bool = False,
) -> list[Spec]:
    """Every even placement of a tensor of ``shape``: per axis R, S(d) and optionally P(sum).

    With ``several_axes`` (a parameter's storage) a dim may also be split over several
    axes, in both orders: DTensor's default (outer axis first) and, as ``_S(d, k)`` on the
    first of them, the outer axis splitting last (FSDP over tensor parallel)."""
    per_axis = ["R"] + [f"S({d})" for d in range(len(shape))] + (["P(sum)"] if partial else [])
    specs = []
    for spec in itertools.product(per_axis, repeat=len(mesh_shape)):
        if fits_evenly(spec, shape, mesh_shape):
            specs.append(tuple(spec))
        elif several_axes and fits_evenly(spec, shape, mesh_shape, several_axes=True):
            specs.append(tuple(spec))
            specs.append(_split_last_by_first(tuple(spec), mesh_shape))
    return specs


def _split_last_by_first(spec: Spec, mesh_shape: tuple[int, ...]) -> Spec:
    """``spec`` with each dim split over several axes split by its first axis last."""
    out = list(spec)
    for dim in {d for p in spec if (d := shard_dim(p)) is not None}:
        axes = [a for a, p in enumerate(spec) if shard_dim(p) == dim]
        if len(axes) > 1:
            out[axes[0]] = strided(dim, math.prod(mesh_shape[a] for a in axes[1:]))
    return tuple(out)
