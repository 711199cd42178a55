"""Export a plan as veScale's sharding-plan dict: ``{"parameter": ..., "forward": ...}``.

veScale's ``parallelize_module(model, mesh, plan)`` takes module-level placements keyed by
FQN patterns, one placement per mesh axis:

    {"parameter": {"model.layers.0.mlp.up_proj.weight": ["Shard(0)"]},
     "forward":   {"model.layers.0.mlp.input": [["Replicate()"]],
                   "model.layers.0.mlp.output": [["Replicate()"]],
                   "model.layers.0.self_attn.input": {"hidden_states": [["Replicate()"]]}}}

Placements are written as the strings of their Python constructors; keys are exact FQNs
(regex-safe: a dot matches itself). A module's positional inputs form a list, its
keyword inputs a dict; its outputs a list (one entry for a single tensor). What the
format cannot hold is returned as notes: nested inputs or outputs (a tuple inside a
keyword argument), a positional input that is not a plain tensor in order, the batch
layout, and parameters stored sharded but gathered for use (veScale stores them as used).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoplan.plan import Plan
from autoplan.placements import Spec

_POSITIONAL = re.compile(r"^\[0\]\[(\d+)\]$")
_KEYWORD = re.compile(r"^\[1\]\['([^'\]]+)'\]$")
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
        parameters[fqn] = [_placement(p) for p in use]
    forward: dict = {}
    for fqn, layout in sorted(plan.modules.items()):
        if layout.inputs:
            inputs = _inputs(fqn, layout.inputs, notes)
            if inputs is not None:
                forward[f"{fqn}.input"] = inputs
        if layout.outputs:
            outputs = _outputs(fqn, layout.outputs, notes)
            if outputs is not None:
                forward[f"{fqn}.output"] = outputs
    batch = {key: list(b.placements) for key, b in sorted(plan.inputs.items())}
    notes.append(f"the batch layout is not part of a veScale plan: {batch}")
    return VescaleExport({"parameter": parameters, "forward": forward}, tuple(notes))


def _placement(short: str) -> str:
    if short == "R":
        return "Replicate()"
    if short.startswith("S("):
        return f"Shard({short[2:-1]})"
    if short.startswith("P("):
        return f'Partial("{short[2:-1]}")'
    raise ValueError(f"expected a placement R, S(d) or P(op), got {short!r}")


def _specs(spec: Spec) -> list[str]:
    return [_placement(p) for p in spec]


def _inputs(fqn: str, layouts: dict[str, Spec], notes: list[str]):
    positional: dict[int, Spec] = {}
    keyword: dict[str, Spec] = {}
    for key, spec in layouts.items():
        if m := _POSITIONAL.match(key):
            positional[int(m[1])] = spec
        elif m := _KEYWORD.match(key):
            keyword[m[1]] = spec
        else:
            notes.append(f"{fqn} input {key}: a nested input has no place in a veScale plan; left out")
    if positional and sorted(positional) != list(range(len(positional))):
        notes.append(f"{fqn}: positional inputs {sorted(positional)} are not the first ones in order; left out")
        positional = {}
    if positional and keyword:
        notes.append(f"{fqn}: mixes positional and keyword inputs; exported the positional ones only")
    if positional:
        return [_specs(positional[i]) for i in range(len(positional))]
    if keyword:
        return {name: _specs(spec) for name, spec in sorted(keyword.items())}
    return None


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
