"""Export a plan as veScale's sharding-plan dict: ``{"parameter": ..., "forward": ...}``.

veScale's ``parallelize_module(model, mesh, plan)`` takes module-level placements keyed by
FQN patterns, one placement per mesh axis:

    {"parameter": {"mlp\\.up_proj.weight": ["Shard(0)"]},
     "forward":   {"mlp.input": [["Replicate()"]],
                   "mlp.output": [["Replicate()"]],
                   "self_attn.input": {"hidden_states": ["Shard(1)"],
                                       "position_embeddings": [["Replicate()"], ["Replicate()"]]}}}

Placements are written as the strings of their Python constructors. veScale matches the
module part of each key (before its last dot) with ``re.fullmatch``, so module FQNs are
written regex-escaped (``model\\.layers\\.0\\.mlp.input``). A module's positional inputs
form a list; keyword inputs a dict (a tuple-valued one as a list, positional ones then
under "args"); outputs a list (one entry for a single tensor). What the format cannot
hold is returned as notes: deeper nesting, inputs that are not the first ones in order,
the batch layout, and parameters stored sharded but gathered for use (veScale stores
them as used).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoplan.placements import Spec, is_shard, shard_dim, strided_factor
from autoplan.plan.module_plan import Plan

_POSITIONAL = re.compile(r"^\[0\]\[(\d+)\]$")
_KEYWORD = re.compile(r"^\[1\]\['([^'\]]+)'\]$")
_KEYWORD_ITEM = re.compile(r"^\[1\]\['([^'\]]+)'\]\[(\d+)\]$")
_OUTPUT = re.compile(r"^\[(\d+)\]$")


@dataclass(frozen=True, slots=True)
class VescaleExport:
    plan: dict
    """``{"parameter": {fqn: [placement, ...]}, "forward": {fqn.input|fqn.output: ...}}``."""
    not_expressed: tuple[str, ...]


def export_vescale(plan: Plan) -> VescaleExport:
    notes: list[str] = []
    parameters = {}
    for fqn, stored in sorted(plan.parameters.items()):
        use = plan.parameter_uses.get(fqn, stored)
        if use != stored:
            notes.append(f"{fqn}: stored {list(stored)} and gathered to {list(use)} for use (FSDP-style); exported as used")
        parameters[_pattern(fqn)] = [_placement(p) for p in use]
    forward: dict = {}
    for fqn, layout in sorted(plan.modules.items()):
        if layout.inputs:
            inputs = _inputs(fqn, layout.inputs, notes)
            if inputs is not None:
                forward[f"{re.escape(fqn)}.input"] = inputs
        if layout.outputs:
            outputs = _outputs(fqn, layout.outputs, notes)
            if outputs is not None:
                forward[f"{re.escape(fqn)}.output"] = outputs
    batch = {key: list(b.placements) for key, b in sorted(plan.inputs.items())}
    notes.append(f"the batch layout is not part of a veScale plan: {batch}")
    return VescaleExport({"parameter": parameters, "forward": forward}, tuple(notes))


def _pattern(fqn: str) -> str:
    """veScale matches the module part of a key (before the last dot) with ``re.fullmatch``."""
    module, dot, leaf = fqn.rpartition(".")
    return f"{re.escape(module)}{dot}{leaf}"


def _placement(short: str) -> str:
    if short == "R":
        return "Replicate()"
    if strided_factor(short):
        return f"_StridedShard({shard_dim(short)}, split_factor={strided_factor(short)})"
    if is_shard(short):
        return f"Shard({shard_dim(short)})"
    if short.startswith("P("):
        return f'Partial("{short[2:-1]}")'
    raise ValueError(f"expected a placement R, S(d) or P(op), got {short!r}")


def _specs(spec: Spec) -> list[str]:
    return [_placement(p) for p in spec]


def _inputs(fqn: str, layouts: dict[str, Spec], notes: list[str]):
    """A list for positional inputs alone; else a dict of keyword inputs (a tuple-valued
    one as a list), with the positional ones under "args"."""
    positional: dict[int, Spec] = {}
    keyword: dict[str, Spec | dict[int, Spec]] = {}
    for key, spec in layouts.items():
        if m := _POSITIONAL.match(key):
            positional[int(m[1])] = spec
        elif m := _KEYWORD.match(key):
            keyword[m[1]] = spec
        elif m := _KEYWORD_ITEM.match(key):
            item = keyword.setdefault(m[1], {})
            if isinstance(item, dict):
                item[int(m[2])] = spec
        else:
            notes.append(f"{fqn} input {key}: a nested input has no place in a veScale plan; left out")
    out: dict = {}
    for name, value in sorted(keyword.items()):
        if isinstance(value, dict):
            if sorted(value) != list(range(len(value))):
                notes.append(f"{fqn} input {name}: items {sorted(value)} are not the first ones in order; left out")
                continue
            out[name] = [_specs(value[i]) for i in range(len(value))]
        else:
            out[name] = _specs(value)
    if positional:
        if sorted(positional) != list(range(len(positional))):
            notes.append(f"{fqn}: positional inputs {sorted(positional)} are not the first ones in order; left out")
        else:
            args = [_specs(positional[i]) for i in range(len(positional))]
            if not out:
                return args
            out["args"] = args
    return out or None


def _outputs(fqn: str, layouts: dict[str, Spec], notes: list[str]):
    if set(layouts) == {""}:
        return [_specs(layouts[""])]
    indexed: dict[int, Spec] = {}
    for key, spec in layouts.items():
        if m := _OUTPUT.match(key):
            indexed[int(m[1])] = spec
        else:
            notes.append(f"{fqn} output {key}: a nested or named output has no place in a veScale plan; left out")
    if not indexed:
        return None
    if sorted(indexed) != list(range(len(indexed))):
        notes.append(f"{fqn}: outputs {sorted(indexed)} are not the first ones in order; left out")
        return None
    return [_specs(indexed[i]) for i in range(len(indexed))]
