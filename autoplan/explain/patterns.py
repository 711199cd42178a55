"""Layouts in the words people use for them: data parallel, FSDP, column- and row-parallel.

A plan stores placement strings per parameter and mesh axis (``[S(0), S(1)]``); an ML
engineer reads "column-parallel on tp, FSDP on dp". The words come from two facts the
plan records per parameter and axis: how it is stored (``parameters``) and how its module
computes with it (``parameter_uses``, where that differs):

    stored S(d), used R        FSDP-style sharded storage (gathered before use)
    used S(d), Linear/Conv1D   column-parallel (output features) / row-parallel (input features)
    used S(0), Embedding       vocab-parallel (rows of the table); S(1): column-parallel
    used S(0), 3-D expert      expert-parallel (one group of experts per rank); S(1) / S(2):
                               column- / row-parallel in each expert, stacked (expert, out, in)
    used S(d), other 2-D weight   as nn.Linear's (a router): column- / row-parallel
    used S(0), 1-D             feature-split (a norm's scale, split with its features)
    used S(d), anything else   sharded on dim d
    R, activations split       data parallel (batch dim), sequence-parallel (dim 1 of a
                               3-D activation), hidden-split (any other dim)
    R, activations R           replicated

Activations are read from the module's boundary layouts (its first output, else its
first input). A weight computed with sharded on every axis is "2-D sharded", and one
stored so, "2-D sharded storage". A repeated block ("model.layers.0" ... "31") whose rows
read the same is folded into one row, "model.layers.0-31".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from autoplan.evaluate.projections import WEIGHT_DIMS
from autoplan.placements import format_spec, is_partial, shard_dim

DATA_PARALLEL = "data parallel"
FSDP = "FSDP-style sharded storage"
COLUMN = "column-parallel"
ROW = "row-parallel"
VOCAB = "vocab-parallel"
SEQUENCE = "sequence-parallel"
EXPERT = "expert-parallel"
REPLICATED = "replicated"
TWO_D = "2-D sharded"
FEATURES = "feature-split"

_NUMBER = re.compile(r"\.(\d+)(?=\.|$)")


@dataclass(frozen=True)
class ModuleRow:
    """One module that owns parameters, or several identical repeated ones folded."""

    name: str
    """FQN, with a folded block's index range: "model.layers.0-31.mlp.up_proj"."""
    kind: str
    """Module class name ("Linear"), "" where the plan does not record it."""
    words: tuple[str, ...]
    """Per mesh axis: the pattern in words."""
    pattern: str
    """The whole layout in a few words ("column-parallel (dp) + FSDP (tp)")."""
    stored: str
    """Main parameter's stored placements, "[S(0), S(1)]"."""
    used: str
    """Placements it is computed with ("" when the same as stored)."""
    activations: str
    """The module's output (else input) layout, "" where the plan records none."""
    count: int = 1
    """Modules folded into this row."""

    def key(self) -> tuple:
        return (self.kind, self.words, self.pattern, self.stored, self.used, self.activations)


def module_rows(plan) -> list[ModuleRow]:
    """One row per module that owns parameters, repeated blocks folded, in model order
    (numbers compared as numbers: layer 10 after layer 9)."""
    return fold(unfolded_rows(plan))


def unfolded_rows(plan) -> list[ModuleRow]:
    """One row per module that owns parameters, in model order, nothing folded."""
    owned: dict[str, list[str]] = {}
    for fqn in plan.parameters:
        owned.setdefault(fqn.rpartition(".")[0], []).append(fqn)
    rows = [_row(plan, module, names) for module, names in owned.items()]
    return sorted(rows, key=lambda r: natural_key(r.name))


def _row(plan, module: str, names: list[str]) -> ModuleRow:
    kind = plan.module_types.get(module, "")
    main = max(names, key=lambda f: (parameter_numel(plan, f), f.endswith("weight")))
    stored = tuple(plan.parameters[main])
    used = tuple(plan.parameter_uses.get(main, stored))
    shape = tuple(plan.parameter_shapes.get(main, ()))
    acts = _activation_spec(plan, module)
    words = tuple(
        axis_word(kind, main, shape, stored[a], used[a], acts[a] if acts else None)
        for a in range(len(plan.mesh_shape))
    )
    return ModuleRow(
        name=module or "<root>",
        kind=kind,
        words=words,
        pattern=pattern_words(words, stored, used, plan.axis_names),
        stored=format_spec(stored),
        used=format_spec(used) if used != stored else "",
        activations=format_spec(acts) if acts else "",
    )


def axis_word(kind: str, fqn: str, shape: tuple[int, ...], stored: str, used: str, activation: str | None) -> str:
    """The pattern of one parameter on one mesh axis (the table in the module docstring)."""
    if shard_dim(stored) is not None and shard_dim(used) is None:
        return FSDP
    dim = shard_dim(used)
    if dim is None:
        return activation_word(activation)
    leaf = fqn.rpartition(".")[2]
    if len(shape) == 3 and "expert" in fqn.lower():
        # experts stacked as (expert, out, in), each one's weight as nn.Linear stores it
        return {0: EXPERT, 1: f"{COLUMN} (each expert)", 2: f"{ROW} (each expert)"}[dim]
    if kind == "Embedding":
        return VOCAB if dim == 0 else COLUMN
    if kind in WEIGHT_DIMS and leaf == "weight":
        column, row = WEIGHT_DIMS[kind]
        return COLUMN if dim == column else ROW if dim == row else f"sharded on dim {dim}"
    if kind in WEIGHT_DIMS and leaf == "bias":
        return COLUMN
    if len(shape) == 2 and leaf == "weight":  # a router or other (out, in) weight used as nn.Linear's
        return COLUMN if dim == 0 else ROW
    if len(shape) == 1:  # a norm's scale: split with the features it scales
        return FEATURES
    return f"sharded on dim {dim}"


def activation_word(placement: str | None) -> str:
    """What a replicated weight with activations laid out ``placement`` on an axis is."""
    dim = shard_dim(placement) if placement else None
    if dim == 0:
        return DATA_PARALLEL
    if dim == 1:
        return SEQUENCE
    if dim is not None:
        return f"activations split on dim {dim}"
    if placement and is_partial(placement):
        return "partial sums"
    return REPLICATED


def pattern_words(words: tuple[str, ...], stored, used, axis_names) -> str:
    """The layout in one phrase: "2-D sharded" where the weight is computed with sharded on
    every axis of a mesh of two or more, else each axis's word with the axis named."""
    if len(words) > 1 and all(shard_dim(p) is not None for p in used):
        return TWO_D
    if len(set(words)) == 1:
        return words[0]
    short = {FSDP: "FSDP"}
    phrase = " + ".join(f"{short.get(w, w)} ({name})" for w, name in zip(words, axis_names) if w != REPLICATED)
    if len(words) > 1 and all(shard_dim(p) is not None for p in stored):
        phrase += "; 2-D sharded storage"
    return phrase or REPLICATED


def _activation_spec(plan, module: str):
    layout = plan.modules.get(module)
    if layout is None:
        return None
    for side in (layout.outputs, layout.inputs):
        if side:
            return tuple(side[sorted(side)[0]])
    return None


def parameter_numel(plan, fqn: str) -> int:
    """Elements of parameter ``fqn``, from the global shape the plan records."""
    return math.prod(plan.parameter_shapes.get(fqn, ()))


def natural_key(name: str) -> tuple:
    """Sort key that compares runs of digits as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def fold(rows: list, key=lambda row: row.key()) -> list:
    """Fold rows (dataclasses with ``name`` and ``count``) that differ only in one block index (the first number in the FQN) into
    ranges of consecutive indices: "model.layers.0-31.mlp". A layer laid out unlike its
    neighbours breaks the range and keeps its own row."""
    groups: dict[tuple, list[tuple[int, ModuleRow]]] = {}
    order: list[tuple] = []
    for row in rows:
        match = _NUMBER.search(row.name)
        if match is None:
            place = (row.name, None)
            index = 0
        else:
            place = (row.name[: match.start()], row.name[match.end():])
            index = int(match.group(1))
        if place not in groups:
            order.append(place)
        groups.setdefault(place, []).append((index, row))
    folded: list = []
    for place in order:
        members = sorted(groups[place], key=lambda p: p[0])
        if place[1] is None:
            folded.extend(row for _, row in members)
            continue
        run: list[tuple[int, ModuleRow]] = []
        for index, row in members:
            if run and (index != run[-1][0] + 1 or key(row) != key(run[-1][1])):
                folded.append(_merge(place, run))
                run = []
            run.append((index, row))
        if run:
            folded.append(_merge(place, run))
    return sorted(folded, key=lambda r: natural_key(r.name))


def _merge(place: tuple, run: list[tuple[int, ModuleRow]]):
    first, last = run[0][0], run[-1][0]
    if len(run) == 1:
        return run[0][1]
    return replace(run[0][1], name=f"{place[0]}.{first}-{last}{place[1]}", count=len(run))
