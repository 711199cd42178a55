"""The layouts a person would try for one block of a model, as parameter placements.

A block ("unit") is a repeated layer (every layer of the stack, laid out alike: a
repeated layer counts once), or a module that owns parameters outside the stack
(embeddings, the final norm, the output head). For each unit, the alternatives:

    replicated (data parallel)    every parameter R on every axis
    FSDP on <dp>                  each parameter sharded on the data-parallel axis along its
                                  first dim that divides (as evaluate/baselines.py's fsdp)
    Megatron on <axis>            per mesh axis: q/k/v, gate/up (and an output head) column-
                                  parallel, o/down row-parallel, an embedding table split by
                                  vocabulary; norms and the rest replicated
    Megatron on <tp> + FSDP on <dp>   on a 2-D mesh, both
    expert-parallel on <axis>     where the block stacks experts (a 3-D parameter named for
                                  them): split by expert on that axis, the rest replicated;
                                  and Megatron on <tp> with experts split on <dp>
    the plan's own                the plan's placements of that unit

Each is a table FQN -> placements for the unit's parameters only; ``explain.py`` pins it
and lets the solver lay out the rest of the model. Alternatives that come out the same
as one before them (a norm has no Megatron layout) are left out, and so are dims that do
not divide (replicated there, with a note).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoplan.evaluate.projections import WEIGHT_DIMS
from autoplan.evaluate.projections import projection_role as _role
from autoplan.placements import is_shard, replicated, shard, shard_dim

PLAN_OWN = "the plan's own"
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


@dataclass(frozen=True)
class Unit:
    name: str
    """What the unit is called in tables: "model.layers.0-31", "lm_head"."""
    parameters: tuple[str, ...]
    """Every parameter FQN the unit lays out (all layers of a repeated one)."""


@dataclass(frozen=True)
class Alternative:
    name: str
    layout: dict
    """Parameter FQN -> placements."""
    notes: tuple[str, ...] = ()


def units_of(plan, module: str | None = None) -> list[Unit]:
    """The plan's blocks: each stack of numbered layers as one unit, each other module that
    owns parameters as its own; with ``module``, the one unit of that module (its number,
    if any, standing for every layer)."""
    if module is not None:
        names = tuple(f for f in plan.parameters if _under(f, module))
        if not names:
            from autoplan.errors import PlanError

            raise PlanError(f"no parameters under module {module!r} in the plan", hint="pass a module FQN from `autoplan show`")
        return _tied_units([Unit(_folded(module, plan), names)], plan)
    stacks: dict[str, list[str]] = {}
    singles: dict[str, list[str]] = {}
    for fqn in plan.parameters:
        match = _INDEX.search(fqn)
        if match:
            stacks.setdefault(fqn[: match.start()], []).append(fqn)
        else:
            singles.setdefault(fqn.rpartition(".")[0], []).append(fqn)
    units = []
    for head, fqns in stacks.items():
        indices = sorted({int(match.group(1)) for f in fqns if (match := _INDEX.search(f))})  # each matched above
        label = f"{head}.{indices[0]}-{indices[-1]}" if len(indices) > 1 else f"{head}.{indices[0]}"
        units.append(Unit(label, tuple(fqns)))
    units += [Unit(owner or "<root>", tuple(names)) for owner, names in singles.items()]
    from autoplan.explain.patterns import natural_key

    return sorted(_tied_units(units, plan), key=lambda u: natural_key(u.name))


def _tied_units(units: list[Unit], plan) -> list[Unit]:
    """Units whose parameters are one tensor (``plan.tied_parameters``: an output head tied
    to the embedding) as one unit naming every member: pinning either lays out the same
    weight, so apart they gave identical rows. The merged unit lays out the tensor under
    the name it is stored by. A unit that shares only some of its parameters is kept and
    named "(tied with ...)"."""
    tied = getattr(plan, "tied_parameters", {}) or {}
    if not tied:
        return units

    def tensors(unit: Unit) -> frozenset[str]:
        return frozenset(tied.get(f, f) for f in unit.parameters)

    groups: dict[frozenset[str], list[Unit]] = {}
    for unit in units:
        groups.setdefault(tensors(unit), []).append(unit)
    merged = []
    for members in groups.values():
        if len(members) == 1:
            merged.append(members[0])
            continue
        owner = next((u for u in members if not any(f in tied for f in u.parameters)), members[0])
        others = [u.name for u in members if u is not owner]
        parameters = tuple(dict.fromkeys(tied.get(f, f) for f in owner.parameters))
        merged.append(Unit(f"{owner.name} (tied with {', '.join(others)})", parameters))
    out = []
    for unit in merged:
        if "(tied with " not in unit.name:
            own = set(unit.parameters)
            aliases = {f for f in (*tied, *tied.values()) if f not in own and tied.get(f, f) in tensors(unit)}
            if aliases:
                owners = sorted({_folded(f.rpartition(".")[0], plan) or "<root>" for f in aliases})
                unit = Unit(f"{unit.name} (tied with {', '.join(owners)})", unit.parameters)
        out.append(unit)
    return out


def _under(fqn: str, module: str) -> bool:
    """Whether parameter ``fqn`` is inside ``module``, or inside the same module of another
    layer when ``module`` names a numbered layer ("model.layers.0.mlp": every layer's mlp)."""
    match = _INDEX.search(module)
    if match is None:
        return fqn.startswith(module + ".")
    other = _INDEX.search(fqn)
    if other is None or fqn[: other.start()] != module[: match.start()]:
        return False
    return fqn[other.end():].startswith(module[match.end():] + ".")


def _folded(module: str, plan) -> str:
    match = _INDEX.search(module)
    if not match:
        return module
    head = module[: match.start()]
    indices = sorted({int(m.group(1)) for f in plan.parameters if f.startswith(head + ".") for m in [_INDEX.search(f)] if m})
    if len(indices) <= 1:
        return module
    return f"{head}.{indices[0]}-{indices[-1]}{module[match.end():]}"


def alternatives_for(unit: Unit, plan) -> list[Alternative]:
    """The alternatives of the module docstring for ``unit``, duplicates left out."""
    mesh, names = tuple(plan.mesh_shape), tuple(plan.axis_names)
    dp = names.index("dp") if "dp" in names else 0
    tp = names.index("tp") if "tp" in names else len(mesh) - 1
    candidates = [Alternative("replicated (data parallel)", {f: replicated(len(mesh)) for f in unit.parameters})]
    fsdp, fsdp_notes = _fsdp(unit, plan, dp, {})
    candidates.append(Alternative(f"FSDP on {names[dp]}", fsdp, fsdp_notes))
    for axis in range(len(mesh)):
        layout, notes = _megatron(unit, plan, axis)
        candidates.append(Alternative(f"Megatron on {names[axis]}", layout, notes))
    if len(mesh) >= 2 and tp != dp:
        mega, notes = _megatron(unit, plan, tp)
        both, more = _fsdp(unit, plan, dp, mega)
        candidates.append(Alternative(f"Megatron on {names[tp]} + FSDP on {names[dp]}", both, notes + more))
    if any(_is_expert(plan, f) for f in unit.parameters):
        for axis in range(len(mesh)):
            layout, notes = _experts(unit, plan, axis, {})
            candidates.append(Alternative(f"expert-parallel on {names[axis]}", layout, notes))
        if len(mesh) >= 2 and tp != dp:
            layout, notes = _experts(unit, plan, dp, _megatron(unit, plan, tp)[0])
            candidates.append(Alternative(f"Megatron on {names[tp]} + expert-parallel on {names[dp]}", layout, notes))
    own = {f: tuple(plan.parameters[f]) for f in unit.parameters}
    candidates.append(Alternative(PLAN_OWN, own))
    # One row per distinct layout, named by every alternative that gives it: a norm's
    # "Megatron" is its replicated layout, and the plan's own may be one of the others.
    kept: dict[tuple, Alternative] = {}
    for alt in candidates:
        key = tuple(sorted(alt.layout.items()))
        if key in kept:
            first = kept.pop(key)
            names = (alt.name, first.name) if alt.name == PLAN_OWN else (first.name, alt.name)
            alt = Alternative(" = ".join(names), alt.layout, first.notes + alt.notes)
        kept[key] = alt
    return sorted(kept.values(), key=lambda a: a.name.startswith(PLAN_OWN))


def _shape(plan, fqn: str) -> tuple[int, ...]:
    return tuple(plan.parameter_shapes.get(fqn, ()))


def _is_expert(plan, fqn: str) -> bool:
    """Experts stacked in one parameter: (expert, out, in), under a module named for them."""
    return len(_shape(plan, fqn)) == 3 and "expert" in fqn.lower()


def _experts(unit: Unit, plan, axis: int, base: dict) -> tuple[dict, tuple[str, ...]]:
    """Each stacked-experts parameter split by expert (dim 0) on ``axis``; the rest as ``base``."""
    mesh = plan.mesh_shape
    layout, notes = {}, []
    for fqn in unit.parameters:
        spec = list(base.get(fqn, replicated(len(mesh))))
        if _is_expert(plan, fqn):
            spec = list(replicated(len(mesh)))
            if _shape(plan, fqn)[0] % mesh[axis]:
                notes.append(f"{fqn}: {_shape(plan, fqn)[0]} experts do not divide {mesh[axis]}, replicated")
            else:
                spec[axis] = shard(0)
        layout[fqn] = tuple(spec)
    return layout, tuple(notes)


def _fsdp(unit: Unit, plan, dp: int, base: dict) -> tuple[dict, tuple[str, ...]]:
    mesh = plan.mesh_shape
    layout, notes = {}, []
    for fqn in unit.parameters:
        spec = list(base.get(fqn, replicated(len(mesh))))
        taken = {shard_dim(p) for p in spec if is_shard(p)}
        shape = _shape(plan, fqn)
        dim = next((d for d in range(len(shape)) if d not in taken and shape[d] % mesh[dp] == 0), None)
        if dim is None:
            notes.append(f"{fqn} {list(shape)}: no dim divides {mesh[dp]}, replicated")
        else:
            spec[dp] = shard(dim)
        layout[fqn] = tuple(spec)
    return layout, tuple(notes)


def _megatron(unit: Unit, plan, axis: int) -> tuple[dict, tuple[str, ...]]:
    """Megatron's roles (``evaluate/baselines.py``'s names) on ``axis``; a lone Linear unit
    (an output head) column-parallel, an embedding table vocab-parallel."""
    mesh = plan.mesh_shape
    layout, notes = {}, []
    alone = len({f.rpartition(".")[0] for f in unit.parameters}) == 1
    for fqn in unit.parameters:
        spec = list(replicated(len(mesh)))
        owner, _, leaf = fqn.rpartition(".")
        kind = plan.module_types.get(owner, "")
        role = _role(owner) or ("column" if alone and kind in WEIGHT_DIMS else None)
        dim = None
        if kind == "Embedding" and leaf == "weight":
            dim = 0
        elif role and kind in WEIGHT_DIMS:
            column, row = WEIGHT_DIMS[kind]
            dim = (column if role == "column" else row) if leaf == "weight" else (0 if role == "column" else None)
        shape = _shape(plan, fqn)
        if dim is not None and dim < len(shape):
            if shape[dim] % mesh[axis]:
                notes.append(f"{fqn}: dim {dim} of {list(shape)} does not divide {mesh[axis]}, replicated")
            else:
                spec[axis] = shard(dim)
        layout[fqn] = tuple(spec)
    return layout, tuple(notes)
