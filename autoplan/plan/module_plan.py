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
from autoplan.placements import Spec, format_spec, layout_problem
from autoplan.plan.pipeline_plan import PipelinePlan, check_pipeline_data
from autoplan.validation import check_schema, read_json

SCHEMA_VERSION = 1
"""The plan format's version; its schema is ``autoplan/schemas/plan.schema.json``."""
_FIX = "re-create it with `autoplan suggest`"
RECOMPUTE_MODES = ("full", "selective")
"""What ``Plan.recompute`` may say of a module."""


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
    """At the peak: the batch, activations kept for backward and the backward's temporaries."""
    collectives: dict = field(default_factory=dict)
    """Collectives of one training step: axis name -> kind -> {"count", "bytes"} (``plan/collectives.py``)."""
    module_collectives: dict = field(default_factory=dict)
    """The same per module FQN ("<root>" for ops outside any module): what ``autoplan verify`` checks."""
    memory: dict = field(default_factory=dict)
    """The peak by category (``MEMORY_CATEGORIES``, bytes; they sum to ``peak_memory_bytes``);
    empty in plans written before it (``plan/builder.py memory_split``)."""
    compute_split: dict = field(default_factory=dict)
    """``compute_s`` by what it is made of (``COMPUTE_SPLIT``, seconds; they sum to
    ``compute_s`` within rounding): the cost stage's per-op parts (``cost/estimate.py``'s
    ``COMPUTE_PARTS``) and the checkpointed layers' forward reruns. Empty in plans
    written before it."""


COMPUTE_SPLIT = ("arithmetic_s", "below_peak_s", "memory_bound_s", "launch_s", "dispatch_s", "optimizer_s", "recompute_s")
"""The keys of ``Predicted.compute_split``: ``cost/estimate.py``'s ``COMPUTE_PARTS`` and
``recompute_s``, the reruns of checkpointed layers' forward ops (all their parts together)."""


MEMORY_CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations", "temporaries")
"""The split of ``Predicted.memory``: torch's ``MemTracker`` categories."""


@dataclass(frozen=True)
class SolverReport:
    status: str
    objective: float
    bound: float
    gap: float
    memory_budget_bytes: float | None = None
    """The per-device memory budget the plan was solved under, in bytes (``--memory-gb`` x
    10**9, ``--memory-gib`` x 2**30, or the profile's device memory); None in plan files
    written before plans recorded it. ``score`` and ``explain`` judge the plan against it."""


@dataclass(frozen=True)
class ContextLayout:
    """The sequence split over one mesh axis: context parallel (``dtensor/context_attention.py``)."""

    axis: str
    """The context axis's name."""
    axis_index: int
    size: int
    load_balance: str = "head_tail"
    """How the sequence is ordered on the axis: torch's head-tail load balancing (of ``2 x size``
    chunks, rank ``r`` holds chunks ``r`` and ``2 x size - 1 - r``)."""
    attention: str = "all_gather_kv"
    """Keys and values gathered over the axis for attention; their gradients reduce-scattered back."""
    sequence_inputs: tuple[str, ...] = ()
    """Batch keys split on their sequence dim (dim 1) there, put in the load-balanced order by ``shard_batch``."""
    alternative_step_s: float | None = None
    """The step the same plan predicts without the sequence split, where it was solved."""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["sequence_inputs"] = list(self.sequence_inputs)
        if self.alternative_step_s is None:
            del data["alternative_step_s"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ContextLayout:
        return cls(**{**data, "sequence_inputs": tuple(data.get("sequence_inputs", ()))})


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
    parameter_readers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """FQN (of ``parameter_uses``) -> the other modules whose own code reads the parameter
    (Mamba's mixer passes ``self.conv1d.weight`` to the convolution itself, never calling
    ``conv1d``): each gathers it to the use layout around its forward, as the owner does."""
    module_types: dict[str, str] = field(default_factory=dict)
    """FQN -> class name of each module that owns parameters (for exports to ParallelStyles)."""
    parameter_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """FQN -> the parameter's global shape: what ``apply_plan`` checks the model against."""
    parameter_dtypes: dict[str, str] = field(default_factory=dict)
    """FQN -> the parameter's dtype ("bfloat16"): what its bytes and the device's peak are counted in."""
    tied_parameters: dict[str, str] = field(default_factory=dict)
    """FQN -> the FQN of the one tensor it is (tied weights: an output head sharing the
    embedding's); stored, gathered and counted once, under that name."""
    recompute: dict[str, str] = field(default_factory=dict)
    """Module FQN -> "full" or "selective": activation checkpointing (``apply/recompute.py``).
    The module's call runs again in the backward, its activations not kept ("full"), or
    all but its matmul and attention outputs ("selective"); modules not named are not recomputed."""
    regime: str = "none"
    """The compile regime the step is priced for (``cost/regime.py``): "none" (eager),
    "block" (each repeated block compiled) or "whole"; plans written before plans recorded
    it were priced eager."""
    pipeline: PipelinePlan | None = None
    """Pipeline stages over a pipeline axis (``plan/pipeline_plan.py``); None: no pipeline.
    Where set, ``mesh_shape``/``axis_names`` are one stage's mesh, the full mesh less that axis."""
    context_parallel: ContextLayout | None = None
    """The sequence split over one mesh axis (context parallel); None: none."""
    attention_flops: float = 0.0
    """Attention's score and value products in one step, forward and backward
    (``pipeline/attention_flops.py``): what MFU adds to 6 x parameters x tokens. 0: none
    counted (no fused attention traced, or a plan written before plans counted it)."""
    expert_parallel: dict[str, dict] = field(default_factory=dict)
    """Experts module FQN -> {"axis": mesh axis name, "experts": E, "call": "routed" or
    "grouped"}: the module's experts are split over that axis, each rank holding E/n, and
    its tokens sent to them and back by all_to_all (``plan/expert_parallel.py``)."""

    def to_dict(self) -> dict:
        data = {
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
            "parameter_readers": {fqn: list(readers) for fqn, readers in sorted(self.parameter_readers.items())},
            "module_types": dict(sorted(self.module_types.items())),
            "parameter_shapes": {fqn: list(shape) for fqn, shape in sorted(self.parameter_shapes.items())},
            "parameter_dtypes": dict(sorted(self.parameter_dtypes.items())),
            "tied_parameters": dict(sorted(self.tied_parameters.items())),
            "recompute": dict(sorted(self.recompute.items())),
            "regime": self.regime,
        }
        if self.pipeline is not None:  # absent otherwise: plans without stages keep their bytes
            data["pipeline"] = self.pipeline.to_dict()
        if self.context_parallel is not None:  # absent otherwise: plans without one keep their bytes
            data["context_parallel"] = self.context_parallel.to_dict()
        if self.attention_flops:
            data["attention_flops"] = self.attention_flops
        if self.expert_parallel:  # absent otherwise, as the pipeline
            data["expert_parallel"] = {fqn: dict(sorted(v.items())) for fqn, v in sorted(self.expert_parallel.items())}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically: an existing file is replaced whole or not at all."""
        path = Path(path)
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read and validate a plan file; every problem is a PlanError naming the file and field."""
        data = read_json(path, PlanError, "plan file", "run `autoplan suggest` to write one", _FIX)
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> Plan:
        """Validate plan data (``plan.schema.json``, then ``check_plan_data``) and build the Plan."""
        check_schema(data, "plan", PlanError, f"plan {source}", _FIX)
        check_plan_data(data, source)
        return _build(data)


def check_plan_data(data: dict, source: str) -> None:
    """What the schema cannot say: names and placements per mesh axis, shard dims in range,
    divisible by the axes that shard them, by one axis at most except in a parameter's
    storage (``placements.layout_problem``)."""
    shape, names = tuple(data["mesh"]["shape"]), data["mesh"]["axis_names"]

    def fail(what: str, hint: str = _FIX):
        raise PlanError(f"plan {source}: {what}", hint=hint)

    if len(names) != len(shape):
        fail(f"mesh.axis_names has {len(names)} names for the {len(shape)}-axis mesh.shape {list(shape)}")
    for fqn, mode in data.get("recompute", {}).items():
        if mode not in RECOMPUTE_MODES:
            fail(f"recompute.{fqn or '<root>'}: expected one of {list(RECOMPUTE_MODES)}, got {mode!r}",
                 'name each module to recompute with "full" or "selective", or leave it out')
    for fqn, layout in data.get("expert_parallel", {}).items():
        axis = layout["axis"]
        if axis not in names:
            fail(f"expert_parallel.{fqn}.axis: {axis!r} is not one of the mesh's axes {list(names)}")
        elif layout["experts"] % shape[names.index(axis)]:
            fail(f"expert_parallel.{fqn}: {layout['experts']} experts do not split evenly over the "
                 f"{shape[names.index(axis)]} ranks of axis {axis!r}")
    sizes = data.get("parameter_shapes", {})
    specs = [(f"parameters.{fqn}", spec, sizes.get(fqn)) for fqn, spec in data["parameters"].items()]
    specs += [(f"parameter_uses.{fqn}", spec, sizes.get(fqn)) for fqn, spec in data.get("parameter_uses", {}).items()]
    specs += [(f"inputs.{key}.placements", b["placements"], b["shape"]) for key, b in data["inputs"].items()]
    for fqn, layout in data["modules"].items():
        for side in ("inputs", "outputs"):
            specs += [(f"modules.{fqn}.{side}.{key}", spec, None) for key, spec in layout[side].items()]
    if "pipeline" in data:
        problem = check_pipeline_data(data["pipeline"], data)
        if problem:
            fail(problem)
    for where, spec, tensor_shape in specs:
        if len(spec) != len(shape):
            fail(f"{where}: expected one placement per mesh axis ({len(shape)}), got {spec!r}")
        if tensor_shape is not None:
            stored = where.startswith("parameters.")  # only storage splits a dim over several axes
            problem = layout_problem(tuple(spec), tuple(tensor_shape), shape, several_axes=stored)
            if problem:
                fail(f"{where} {format_spec(tuple(spec))} on a tensor of shape {list(tensor_shape)}: {problem}",
                     "shard only dims the tensor has, by mesh axes whose sizes divide them"
                     + ("" if stored else " (one axis per dim; a stored parameter may use several)"))


def _build(data: dict) -> Plan:
    """The Plan of validated data."""
    spec = tuple
    return Plan(
        mesh_shape=tuple(int(n) for n in data["mesh"]["shape"]),
        axis_names=tuple(data["mesh"]["axis_names"]),
        parameters={fqn: spec(v) for fqn, v in data["parameters"].items()},
        modules={
            fqn: ModuleLayout({k: spec(v) for k, v in m["inputs"].items()}, {k: spec(v) for k, v in m["outputs"].items()})
            for fqn, m in data["modules"].items()
        },
        inputs={key: BatchInput(tuple(int(n) for n in b["shape"]), spec(b["placements"])) for key, b in data["inputs"].items()},
        predicted=Predicted(**data["predicted"]),
        profile=data["profile"],
        fingerprint=data["fingerprint"],
        solver=SolverReport(**data["solver"]),
        warnings=tuple(data["warnings"]),
        fallback_ops=tuple(data.get("fallback_ops", [])),
        opaque_modules=tuple(data.get("opaque_modules", [])),
        parameter_uses={fqn: spec(v) for fqn, v in data.get("parameter_uses", {}).items()},
        parameter_readers={fqn: tuple(v) for fqn, v in data.get("parameter_readers", {}).items()},
        module_types=dict(data.get("module_types", {})),
        parameter_shapes={fqn: tuple(int(n) for n in s) for fqn, s in data.get("parameter_shapes", {}).items()},
        parameter_dtypes=dict(data.get("parameter_dtypes", {})),
        tied_parameters=dict(data.get("tied_parameters", {})),
        recompute=dict(data.get("recompute", {})),
        regime=data.get("regime", "none"),
        pipeline=PipelinePlan.from_dict(data["pipeline"]) if "pipeline" in data else None,
        context_parallel=ContextLayout.from_dict(data["context_parallel"]) if "context_parallel" in data else None,
        attention_flops=float(data.get("attention_flops", 0.0)),
        expert_parallel={fqn: dict(v) for fqn, v in data.get("expert_parallel", {}).items()},
    )


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
