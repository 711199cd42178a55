"""Stage 5: the module-level plan, its JSON form, and how it is built from a solution.

The plan is data: per-parameter placements (every parameter FQN, one placement string
per mesh axis), per-module input/output layouts keyed by the path of each tensor in the
module's ``(args, kwargs)`` / output, the batch layout, and the prediction it was chosen
for. Same input, same bytes: keys are sorted, floats rounded, and nothing time-dependent
is stored.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoplan._files import write_atomic
from autoplan.errors import PlanError
from autoplan.placements import Spec, to_placement

SCHEMA_VERSION = 1


def rounded(value: float) -> float:
    """Six significant digits: stable across runs, plenty for predictions."""
    return float(f"{value:.6g}")


@dataclass(frozen=True)
class ModuleLayout:
    inputs: dict[str, Spec] = field(default_factory=dict)
    """Key path into the call's ``(args, kwargs)`` -> placement the module receives."""
    outputs: dict[str, Spec] = field(default_factory=dict)
    """Key path into the module's output -> placement it returns."""


@dataclass(frozen=True)
class BatchInput:
    shape: tuple[int, ...]
    """Global (traced) shape."""
    placements: Spec


@dataclass(frozen=True)
class Predicted:
    step_time_s: float
    compute_s: float
    comm_s: float
    peak_memory_bytes: int
    model_state_bytes: int
    """Parameters, gradients and AdamW state on one device."""
    activation_bytes: int
    """Activations kept for backward on one device."""
    collectives: dict = field(default_factory=dict)
    """Collectives of one training step: axis name -> kind -> {"count", "bytes"} (``collectives.py``)."""
    module_collectives: dict = field(default_factory=dict)
    """The same per module FQN ("<root>" for ops outside any module): what ``autoplan verify`` checks."""


@dataclass(frozen=True)
class SolverReport:
    status: str
    objective: float
    bound: float
    gap: float


@dataclass(frozen=True)
class Plan:
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    parameters: dict[str, Spec]
    modules: dict[str, ModuleLayout]
    inputs: dict[str, BatchInput]
    predicted: Predicted
    profile: str
    fingerprint: str
    solver: SolverReport
    warnings: tuple[str, ...] = ()
    fallback_ops: tuple[str, ...] = ()
    """ATen ops with no DTensor rule, planned replicated; apply_plan lets DTensor run them so."""
    opaque_modules: tuple[str, ...] = ()
    """Modules with data-dependent shapes: apply_plan runs each one replicated, on whole tensors."""
    parameter_uses: dict[str, Spec] = field(default_factory=dict)
    """FQN -> layout the owning module computes with, where it differs from the stored one
    (e.g. stored sharded, gathered to replicated just before use, FSDP-style)."""
    module_types: dict[str, str] = field(default_factory=dict)
    """FQN -> class name of each module that owns parameters (for exports to ParallelStyles)."""
    parameter_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """FQN -> the parameter's global shape: what ``apply_plan`` checks the model against."""

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "mesh": {"shape": list(self.mesh_shape), "axis_names": list(self.axis_names)},
            "parameters": {fqn: list(spec) for fqn, spec in sorted(self.parameters.items())},
            "modules": {
                fqn: {
                    "inputs": {k: list(v) for k, v in sorted(layout.inputs.items())},
                    "outputs": {k: list(v) for k, v in sorted(layout.outputs.items())},
                }
                for fqn, layout in sorted(self.modules.items())
            },
            "inputs": {
                key: {"shape": list(b.shape), "placements": list(b.placements)}
                for key, b in sorted(self.inputs.items())
            },
            "predicted": asdict(self.predicted),
            "profile": self.profile,
            "fingerprint": self.fingerprint,
            "solver": asdict(self.solver),
            "warnings": list(self.warnings),
            "fallback_ops": list(self.fallback_ops),
            "opaque_modules": list(self.opaque_modules),
            "parameter_uses": {fqn: list(spec) for fqn, spec in sorted(self.parameter_uses.items())},
            "module_types": dict(sorted(self.module_types.items())),
            "parameter_shapes": {fqn: list(shape) for fqn, shape in sorted(self.parameter_shapes.items())},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically: an existing file is replaced whole or not at all."""
        path = Path(path)
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(f"no plan file {path}", hint="run `autoplan suggest` to write one") from None
        except (OSError, json.JSONDecodeError) as err:
            raise PlanError(f"plan file {path} is not valid JSON ({err})", hint="re-create it with `autoplan suggest`") from err
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> "Plan":
        return _parse(data, source)


def _parse(data, source: str) -> Plan:
    def fail(what: str):
        raise PlanError(f"plan {source}: {what}", hint="re-create it with `autoplan suggest`")

    def need(mapping, key, where=""):
        if not isinstance(mapping, dict) or key not in mapping:
            fail(f"missing {where}{key}")
        return mapping[key]

    version = need(data, "schema_version")
    if version != SCHEMA_VERSION:
        fail(f"schema_version {version!r}, expected {SCHEMA_VERSION}")
    mesh = need(data, "mesh")
    shape = tuple(need(mesh, "shape", "mesh."))
    names = tuple(need(mesh, "axis_names", "mesh."))
    if not shape or any(not isinstance(n, int) or n < 1 for n in shape) or len(names) != len(shape):
        fail(f"mesh shape {list(shape)} and axis names {list(names)} do not match")

    def spec(value, where) -> Spec:
        if not isinstance(value, list) or len(value) != len(shape):
            fail(f"{where}: expected one placement per mesh axis ({len(shape)}), got {value!r}")
        for p in value:
            to_placement(p)  # raises PlanError on unknown strings
        return tuple(value)

    parameters = {fqn: spec(v, f"parameters.{fqn}") for fqn, v in need(data, "parameters").items()}
    modules = {}
    for fqn, layout in need(data, "modules").items():
        modules[fqn] = ModuleLayout(
            {k: spec(v, f"modules.{fqn}.inputs.{k}") for k, v in need(layout, "inputs", f"modules.{fqn}.").items()},
            {k: spec(v, f"modules.{fqn}.outputs.{k}") for k, v in need(layout, "outputs", f"modules.{fqn}.").items()},
        )
    inputs = {
        key: BatchInput(tuple(need(b, "shape", f"inputs.{key}.")), spec(need(b, "placements", f"inputs.{key}."), f"inputs.{key}"))
        for key, b in need(data, "inputs").items()
    }
    predicted = need(data, "predicted")
    solver = need(data, "solver")
    try:
        return Plan(
            mesh_shape=shape,
            axis_names=names,
            parameters=parameters,
            modules=modules,
            inputs=inputs,
            predicted=Predicted(**predicted),
            profile=str(need(data, "profile")),
            fingerprint=str(need(data, "fingerprint")),
            solver=SolverReport(**solver),
            warnings=tuple(need(data, "warnings")),
            fallback_ops=tuple(str(op) for op in data.get("fallback_ops", [])),
            opaque_modules=tuple(str(fqn) for fqn in data.get("opaque_modules", [])),
            parameter_uses={
                fqn: spec(v, f"parameter_uses.{fqn}") for fqn, v in data.get("parameter_uses", {}).items()
            },
            module_types={str(fqn): str(name) for fqn, name in data.get("module_types", {}).items()},
            parameter_shapes={str(fqn): tuple(int(n) for n in shape) for fqn, shape in data.get("parameter_shapes", {}).items()},
        )
    except TypeError as err:
        fail(f"unexpected fields ({err})")


ROOT_MODULE = "<root>"
"""The module name collective tables give ops outside every module (the model's own forward)."""


def collective_table(counts) -> dict:
    """``((module, axis name, kind, bytes), count)`` pairs as the table ``Predicted`` stores:
    module -> axis -> kind -> {"count", "bytes"} (the prediction, and ``autoplan verify``'s count)."""
    table: dict = {}
    for (module, axis, kind, nbytes), count in sorted(counts):
        entry = table.setdefault(module, {}).setdefault(axis, {}).setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += count
        entry["bytes"] += count * nbytes
    return table


def total_table(modules: dict) -> dict:
    """A ``collective_table`` summed over modules: axis -> kind -> {"count", "bytes"}."""
    total: dict = {}
    for per_axis in modules.values():
        for axis, per_kind in per_axis.items():
            for kind, entry in per_kind.items():
                into = total.setdefault(axis, {}).setdefault(kind, {"count": 0, "bytes": 0})
                into["count"] += entry["count"]
                into["bytes"] += entry["bytes"]
    return {axis: dict(sorted(kinds.items())) for axis, kinds in sorted(total.items())}
