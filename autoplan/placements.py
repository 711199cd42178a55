"""Placement vocabulary shared by every stage.

A *spec* is a tuple with one placement string per mesh axis, in DTensor's short
forms: ``"R"`` (replicate), ``"S(d)"`` (shard tensor dim ``d``), ``"P(sum)"``
(partial sum). "axis" always means a mesh axis, "dim" a tensor dimension.
"""

from __future__ import annotations

import itertools
import re
from functools import cache

from torch.distributed.tensor import Partial, Placement, Replicate, Shard

from autoplan.errors import PlanError

Spec = tuple[str, ...]

REPLICATE = "R"
PARTIAL = "P(sum)"
PARTIAL_AVG = "P(avg)"
_SHARD_RE = re.compile(r"^S\((\d+)\)$")


def shard(dim: int) -> str:
    return f"S({dim})"


@cache  # a handful of distinct strings, asked about millions of times while costing
def shard_dim(placement: str) -> int | None:
    """Tensor dim a ``S(d)`` string shards, else None."""
    match = _SHARD_RE.match(placement)
    return int(match.group(1)) if match else None


def is_shard(placement: str) -> bool:
    return shard_dim(placement) is not None


def is_partial(placement: str) -> bool:
    return placement.startswith("P(")


def to_string(placement: Placement) -> str:
    if isinstance(placement, Replicate):
        return REPLICATE
    if isinstance(placement, Shard) and type(placement) is Shard:
        return shard(placement.dim)
    if type(placement) is Partial and placement.reduce_op in ("sum", "avg"):
        return f"P({placement.reduce_op})"
    raise ValueError(f"expected R, S(d) or P(sum), got {placement!r}")


def to_placement(text: str) -> Placement:
    if text == REPLICATE:
        return Replicate()
    if text in (PARTIAL, PARTIAL_AVG):
        return Partial(text[2:-1])
    dim = shard_dim(text)
    if dim is not None:
        return Shard(dim)
    raise PlanError(
        f"unknown placement {text!r}",
        hint='use "R", "S(<dim>)" or "P(sum)", one per mesh axis',
    )


def to_placements(spec: Spec) -> tuple[Placement, ...]:
    return tuple(to_placement(p) for p in spec)


def spec_from_placements(placements) -> Spec:
    return tuple(to_string(p) for p in placements)


def replicated(mesh_ndim: int) -> Spec:
    return (REPLICATE,) * mesh_ndim


def shard_factor(spec: Spec, mesh_shape: tuple[int, ...]) -> int:
    """How many pieces a tensor with ``spec`` is cut into (its local share is 1/factor)."""
    factor = 1
    for placement, size in zip(spec, mesh_shape):
        if is_shard(placement):
            factor *= size
    return factor


def fits_evenly(spec: Spec, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> bool:
    """True when each sharded dim is sharded by one mesh axis only and divides evenly by it.

    One axis per dim: DTensor (torch 2.13) represents a dim sharded over two axes with
    ``_StridedShard`` after views, and fails to propagate it through later reshapes.
    """
    seen: set[int] = set()
    for placement, size in zip(spec, mesh_shape):
        dim = shard_dim(placement)
        if dim is not None:
            if dim >= len(shape) or dim in seen or shape[dim] % size:
                return False
            seen.add(dim)
    return True


def local_shape(shape: tuple[int, ...], spec: Spec, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    out = list(shape)
    for placement, size in zip(spec, mesh_shape):
        dim = shard_dim(placement)
        if dim is not None:
            out[dim] //= size
    return tuple(out)


def format_spec(spec: Spec) -> str:
    return "[" + ", ".join(spec) + "]"


def candidate_specs(shape: tuple[int, ...], mesh_shape: tuple[int, ...], partial: bool) -> list[Spec]:
    """Every even placement of a tensor of ``shape``: per axis R, S(d) and optionally P(sum)."""
    per_axis = ["R"] + [f"S({d})" for d in range(len(shape))] + (["P(sum)"] if partial else [])
    specs = []
    for spec in itertools.product(per_axis, repeat=len(mesh_shape)):
        if fits_evenly(spec, shape, mesh_shape):
            specs.append(tuple(spec))
    return specs
