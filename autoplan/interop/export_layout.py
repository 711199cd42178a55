"""What a torch export lays out, as a plan, scored beside the plan it came from.

``exported_plan`` writes the export's layout in the plan's own terms:

- parameters: on tp, the placement the ParallelStyle gives the weight (``Colwise`` Linear
  ``S(0)``, ``Rowwise`` ``S(1)``, Embedding the other way round; ``R`` without a style);
  on dp, ``R`` under ``replicate``, the dim ``fully_shard`` splits otherwise (``_S(0, k)``
  over a tp split of dim 0); other axes ``R``;
- the batch: whole on tp (styles take every rank's whole batch), split by sample on dp
  (``replicate`` and ``fully_shard`` feed each rank its own);
- module boundaries: the plan's, except the ones the export keeps whole on tp (``R``) and,
  on dp, a boundary the plan splits on another dim than the batch's (``S(0)`` there: data
  parallel keeps every activation split by sample) or one that carries a batch input
  unchanged (the batch's layout).

``score_export`` scores that plan and the plan itself with ``evaluate/score`` (the
cheapest execution of each layout under the cost model: where a style leaves a choice to
DTensor, the score takes the cheapest) and says by how much they differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from autoplan.evaluate.score import Score, check_plan_for_model, score_problem
from autoplan.interop.export_result import TorchExport
from autoplan.pipeline.problem import GIB, prepare_problem
from autoplan.placements import Spec, shard_dim
from autoplan.plan.module_plan import BatchInput, ModuleLayout, Plan


@dataclass(frozen=True)
class ExportScore:
    exported: Score
    plan: Score
    exact: bool
    """The export writes the plan's own layout (no module differs)."""
    modules_differing: int
    boundaries_moved: dict = field(default_factory=dict)
    """Module -> boundary layouts data parallel changes (found from the trace, beyond ``TorchExport.differences``)."""

    def summary(self) -> str:
        e, p = self.exported, self.plan
        plan_text = f"{p.step_time_s * 1e3:.1f} ms, {_bytes(p.peak_memory_bytes)} peak"
        if self.exact:
            return (f"exported layout: exactly the plan ({plan_text}; the export scores {e.step_time_s * 1e3:.1f} ms, "
                    f"{_bytes(e.peak_memory_bytes)})")
        return (
            f"exported layout: {e.step_time_s * 1e3:.1f} ms, {_bytes(e.peak_memory_bytes)} peak; "
            f"the plan: {plan_text} ({_percent(e.step_time_s, p.step_time_s)}, "
            f"{_percent(e.peak_memory_bytes, p.peak_memory_bytes)}); differs in {self.modules_differing} modules"
        )


def _bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.2f} MiB"


def _percent(value: float, reference: float) -> str:
    return f"{(value / reference - 1) * 100:+.1f} %" if reference else "n/a"


def exported_plan(plan: Plan, export: TorchExport, batch_boundaries: dict[tuple[str, str], str] | None = None,
                  unbatched: set[tuple[str, str, str]] | None = None) -> Plan:
    """The export's layout as a plan (see the module docstring). From the model's trace:
    ``batch_boundaries``, (module, input key) -> the batch key it carries unchanged;
    ``unbatched``, the (module, side, key) boundaries no batch input flows into (whole on
    every dp rank under data parallel)."""
    names = plan.axis_names
    tp = names.index(export.tp_axis) if export.tp_axis else None
    dp = names.index(export.dp_axis) if export.dp_axis else None
    whole = set(export.replicated_boundaries)

    def parameter(fqn: str) -> Spec:
        spec = ["R"] * len(names)
        if tp is not None:
            spec[tp] = export.tp_stored.get(fqn, "R")
        if dp is not None and export.data_parallel:
            spec[dp] = export.data_parallel.stored.get(fqn, "R")
        return tuple(spec)

    batch = {}
    for key, value in plan.inputs.items():
        spec = ["R"] * len(names)
        if dp is not None:
            divides = value.shape and value.shape[0] % plan.mesh_shape[dp] == 0
            spec[dp] = "S(0)" if divides else value.placements[dp]
        batch[key] = BatchInput(value.shape, tuple(spec))

    def boundary(fqn: str, side: str, key: str, spec: Spec) -> Spec:
        out = ["R"] * len(names)
        if tp is not None:
            out[tp] = "R" if (fqn, side, key) in whole else spec[tp]
        if dp is not None:
            carried = (batch_boundaries or {}).get((fqn, key)) if side == "input" else None
            d = shard_dim(spec[dp])
            if carried:
                out[dp] = batch[carried].placements[dp]
            elif unbatched is not None and (fqn, side, key) in unbatched:
                out[dp] = "R"  # every dp rank computes it whole (rotary tables from positions)
            else:
                out[dp] = "S(0)" if d not in (None, 0) else spec[dp]
        return tuple(out)

    modules = {
        fqn: ModuleLayout(
            {k: boundary(fqn, "input", k, s) for k, s in layout.inputs.items()},
            {k: boundary(fqn, "output", k, s) for k, s in layout.outputs.items()},
        )
        for fqn, layout in plan.modules.items()
    }
    return replace(plan, parameters={f: parameter(f) for f in plan.parameters}, inputs=batch, modules=modules,
                   parameter_uses={}, parameter_readers={})


def score_export(model, example_inputs, plan: Plan, export: TorchExport, profile=None, loss_fn=None,
                 time_limit_s: float | None = None) -> tuple[ExportScore, Plan]:
    """Score the exported layout and the plan on one traced model; (scores, exported plan)."""
    from autoplan.evaluate.score import plan_profile

    trace, accepted = check_plan_for_model(model, example_inputs, plan, loss_fn)
    budget = plan.solver.memory_budget_bytes
    problem = prepare_problem(model, example_inputs, plan.mesh_shape, plan.axis_names, plan_profile(plan, profile),
                              budget / GIB if budget else None, trace=trace, loss_fn=loss_fn, regime=plan.regime)
    traced = problem.traced
    batch_boundaries = {
        (call.fqn, key): traced.inputs[node]
        for call in traced.module_calls for key, node in call.inputs if node in traced.inputs
    }
    layout = exported_plan(plan, export, batch_boundaries, _unbatched(problem))
    exported = score_problem(problem, layout, time_limit_s, accepted)
    own = score_problem(problem, plan, time_limit_s, accepted)
    moved = _boundaries_moved(plan, layout)
    modules = set(export.differences) | set(moved)
    result = ExportScore(exported, own, not modules, len(modules), moved)
    return result, layout


def _unbatched(problem) -> set[tuple[str, str, str]]:
    """Module boundaries whose value no batch input flows into (traced dataflow)."""
    traced = problem.traced
    graph = traced.graph_module.graph
    reached = set(traced.inputs)
    for node in graph.nodes:
        if any(arg.name in reached for arg in node.all_input_nodes):
            reached.add(node.name)
    out = set()
    for call in traced.module_calls:
        for side, pairs in (("input", call.inputs), ("output", call.outputs)):
            for key, node in pairs:
                if node not in reached:
                    out.add((call.fqn, side, key))
    return out


def _boundaries_moved(plan: Plan, layout: Plan) -> dict[str, tuple[str, ...]]:
    """Module -> the boundaries on which the exported layout differs from the plan on dp
    (data parallel keeps activations split by sample, or whole where no batch flows)."""
    moved: dict[str, list[str]] = {}
    for fqn, ours in plan.modules.items():
        theirs = layout.modules[fqn]
        for side, a, b in (("input", ours.inputs, theirs.inputs), ("output", ours.outputs, theirs.outputs)):
            for key in sorted(a):
                if a[key] != b[key]:
                    moved.setdefault(fqn, []).append(f"{side} {key or '<output>'} {format_pair(a[key], b[key])}")
    return {m: tuple(v) for m, v in moved.items()}


def format_pair(plan_spec: Spec, export_spec: Spec) -> str:
    return f"[{', '.join(plan_spec)}] in the plan, exported [{', '.join(export_spec)}]"
