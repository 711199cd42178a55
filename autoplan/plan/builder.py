"""Stage 5: turn a solution (one strategy per decision) into a module-level ``Plan``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autoplan.choices.graph import BUFFER, INPUT, OP, PARAMETER
from autoplan.cost.estimate import COMPUTE_PARTS, CostedGraph, compute_part_rows, transient_bytes
from autoplan.cost.memory import STATE_COPIES_END, transient_node
from autoplan.dtensor.strategies import is_inplace
from autoplan.placements import format_spec
from autoplan.plan.collectives import module_table, step_collectives
from autoplan.plan.expert_parallel import solved_expert_layouts
from autoplan.plan.module_plan import (
    COMPUTE_SPLIT,
    MEMORY_CATEGORIES,
    BatchInput,
    ModuleLayout,
    Plan,
    Predicted,
    SolverReport,
    rounded,
    total_table,
)
from autoplan.plan.parameter_uses import parameter_uses, through_views
from autoplan.plan.views import reshaping_readers, within
from autoplan.solve.ilp import Solution
from autoplan.solve.recompute import freed_bytes, rerun_parts
from autoplan.trace.tracer import ModuleCall


@dataclass(frozen=True)
class Checkpointed:
    """The solver's choice to checkpoint the repeated layers (``solve/recompute.py``), in the
    terms of the whole traced graph the prediction is made from."""

    mode: str
    """"full" or "selective"."""
    decisions: frozenset[str]
    """Every traced decision inside the layers: their forward runs again."""
    freed: frozenset[str]
    """Those whose saved outputs the checkpoint frees."""
    share: float
    """Of the freed bytes, what the peak is spared (``RecomputeUnit.freed_share``)."""
    modules: tuple[str, ...]
    """FQNs of the traced layers checkpointed (the plan widens them to the first ``layers``)."""
    rerun_share: float = 1.0
    """Of the layers' forward, what the reruns repeat (``RecomputeUnit.rerun_share``)."""
    layers: int = 0
    """How many of the stack's first layers are checkpointed."""
    inputs: frozenset[str] = frozenset()
    """The first traced layer's outputs nothing saves: each checkpointed layer keeps one as its input."""

    @property
    def recompute(self) -> dict[str, str]:
        return dict.fromkeys(self.modules, self.mode)


def build_plan(
    costed: CostedGraph, choice: dict[str, int], solution: Solution, extra_warnings=(), checkpointed: Checkpointed | None = None,
    collectives: bool = True,
) -> Plan:
    """``choice`` is the full assignment (followers expanded); ``solution`` reports the solve;
    ``checkpointed``: the layers it checkpoints, if any. ``collectives``: predict the step's
    collectives by the rules of ``collectives.py``; without, the tables are left empty for
    a dry run of the step to fill (``verify/dry_run.py``)."""
    choices = costed.choices
    graph = choices.graph
    traced = choices.traced

    def output_spec(name: str, out_index: int = 0):
        return graph.decision(name).strategies[choice[name]].output(out_index)

    parameters, shapes, dtypes, tied = {}, {}, {}, {}
    for node, fqns in traced.parameters.items():
        value = graph.decision(node).fx_node.meta["val"]
        for fqn in fqns:
            parameters[fqn] = output_spec(node)
            shapes[fqn] = tuple(value.shape)
            dtypes[fqn] = str(value.dtype).removeprefix("torch.")
        tied.update(dict.fromkeys(fqns[1:], fqns[0]))
    uses, readers = parameter_uses(choices, choice, parameters)
    inputs = {}
    for node, key in traced.inputs.items():
        decision = graph.decision(node)
        if decision.kind == INPUT:
            value = decision.fx_node.meta["val"]
            inputs[key] = BatchInput(tuple(value.shape), output_spec(node))

    warnings = list(choices.warnings) + list(extra_warnings) + _moved_inplace_selves(graph, choice)
    order = {name: i for i, name in enumerate(graph.nodes)}
    modules: dict[str, ModuleLayout] = {}
    conflicting: set[str] = set()
    for call in traced.module_calls:
        if call.fqn == "":
            continue  # the root's inputs are the batch layout; its outputs go back to the user
        layout = _call_layout(costed, choice, call, output_spec, order)
        if call.fqn in modules and modules[call.fqn] != layout:
            conflicting.add(call.fqn)
        modules.setdefault(call.fqn, layout)
    for fqn in sorted(conflicting):
        del modules[fqn]
        warnings.append(f"module {fqn} is called more than once with different layouts: its boundaries are left to DTensor")
    modules = {fqn: layout for fqn, layout in modules.items() if layout.inputs or layout.outputs}
    # Experts split over an axis: the engine lays their tokens out itself (``apply/expert_parallel.py``).
    experts = solved_expert_layouts(choices, choice)
    modules = {fqn: layout for fqn, layout in modules.items() if fqn not in experts}

    return Plan(
        mesh_shape=choices.mesh_shape,
        axis_names=choices.axis_names,
        parameters=parameters,
        modules=modules,
        inputs=inputs,
        predicted=predict(costed, choice, choices.axis_names, modules, checkpointed, collectives),
        profile=costed.profile.name,
        regime=costed.regime,
        fingerprint=traced.fingerprint,
        solver=SolverReport(solution.status, rounded(solution.objective_s), rounded(solution.bound_s), rounded(solution.gap)),
        warnings=tuple(warnings),
        fallback_ops=choices.fallback_ops,
        opaque_modules=tuple(sorted(m for m in traced.opaque_modules if m not in experts)),
        parameter_uses=uses,
        parameter_readers=readers,
        module_types={
            owner: traced.module_types[owner]
            for owner in {fqn.rpartition(".")[0] for fqn in parameters}
            if owner in traced.module_types
        },
        parameter_shapes=shapes,
        parameter_dtypes=dtypes,
        tied_parameters=tied,
        recompute=checkpointed.recompute if checkpointed is not None else {},
        expert_parallel=experts,
    )


def _moved_inplace_selves(graph, choice: dict[str, int]) -> list[str]:
    """A plan that lays out an in-place op's self other than its producer made it: DTensor
    runs the op where self is instead, so the run will differ from the prediction there."""
    found = []
    for u, v, k, out_index in graph.reads():
        target = graph.decision(v).fx_node.target
        if k != 0 or not isinstance(target, torch._ops.OpOverload) or not is_inplace(target):
            continue
        made = graph.decision(u).strategies[choice[u]].output(out_index)
        wanted = graph.decision(v).strategies[choice[v]].inputs[0]
        if made != wanted:
            found.append(
                f"in-place op {v} ({target}) is planned on self laid out {format_spec(wanted)}, made "
                f"{format_spec(made)}: DTensor runs it where self is, and the run will differ from the prediction there"
            )
    return found


def predict(
    costed: CostedGraph, choice: dict[str, int], axis_names: tuple[str, ...], modules: dict | None = None,
    checkpointed: Checkpointed | None = None, collectives: bool = True,
) -> Predicted:
    """Step time, memory and collectives of one full assignment, from the unsimplified costs
    (``collectives``: by the rules of ``collectives.py``, else left empty)."""
    compute = comm = 0.0
    parts = dict.fromkeys(COMPUTE_SPLIT, 0.0)
    for name, cost in costed.nodes.items():
        i = choice[name]
        compute += cost.compute_s[i]
        comm += cost.comm_s[i]
        for part, row in zip(COMPUTE_PARTS, compute_part_rows(cost)):
            parts[part] += row[i]
    for (u, v, _), edge in costed.edges.items():
        comm += edge.seconds[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
    if checkpointed is not None:
        ops, moves = rerun_parts(costed, choice, checkpointed.decisions, checkpointed.mode, checkpointed.rerun_share)
        compute, comm = compute + ops, comm + moves
        parts["recompute_s"] += ops
    memory = memory_split(costed, choice, checkpointed)
    recompute = checkpointed.recompute if checkpointed is not None else None
    modules = module_table(step_collectives(costed, choice, modules, recompute), axis_names) if collectives else {}
    step_s, compute_s = rounded(compute + comm), rounded(compute)
    return Predicted(
        step_time_s=step_s,
        compute_s=compute_s,
        comm_s=float(f"{step_s - compute_s:.12g}"),  # the rest of the step: the parts add up to it as rounded
        peak_memory_bytes=sum(memory.values()),
        model_state_bytes=int(memory["parameters"] + memory["optimizer"] * (1 + 1 / STATE_COPIES_OPTIMIZER)),
        activation_bytes=int(memory["activations"] + memory["temporaries"]),
        collectives=total_table(modules),
        module_collectives=modules,
        memory=memory,
        compute_split={part: rounded(seconds) for part, seconds in parts.items()},
    )


STATE_COPIES_OPTIMIZER = 2
"""AdamW's moments per parameter: the model state is parameters, as many gradients, and these."""


def memory_split(costed: CostedGraph, choice: dict[str, int], checkpointed: Checkpointed | None = None) -> dict[str, int]:
    """The peak of one assignment by category, at whichever of the two peaks of
    ``cost/memory.py`` is higher: where the backward starts (no parameter gradients yet,
    the saved activations, the first backward op's gradients as temporaries) or where it
    ends (the gradients, no activation but the batch)."""
    choices = costed.choices
    graph = choices.graph
    start = dict.fromkeys(MEMORY_CATEGORIES, 0.0)
    end = dict.fromkeys(MEMORY_CATEGORIES, 0.0)
    transient = transient_node(choices)
    for name, cost in costed.nodes.items():
        decision = graph.decision(name)
        i = choice[name]
        if decision.kind == PARAMETER and decision.requires_grad:
            local = cost.end_bytes[i] / STATE_COPIES_END
            for split in (start, end):
                split["parameters"] += local
                split["optimizer"] += STATE_COPIES_OPTIMIZER * local
            end["gradients"] += local
        elif decision.kind in (PARAMETER, BUFFER):
            key = "parameters" if decision.kind == PARAMETER else "buffers"
            start[key] += cost.memory_bytes[i]
            end[key] += cost.memory_bytes[i]
        elif decision.kind == INPUT:
            start["activations"] += cost.memory_bytes[i]
            end["activations"] += cost.memory_bytes[i]
        else:
            held = transient_bytes(choices, decision, decision.strategies[i]) if name == transient else 0.0
            start["temporaries"] += held
            start["activations"] += cost.memory_bytes[i] - held
    start["activations"] += sum(
        edge.kept_bytes[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
        for (u, v, _), edge in costed.edges.items() if edge.kept_bytes
    )
    # At the forward's heaviest move: the model state as where the backward starts, and what
    # the forward holds up to that move (its buffers as temporaries).
    forward = {key: start[key] for key in ("parameters", "buffers", "optimizer")}
    forward.update(gradients=0.0, activations=0.0, temporaries=0.0)
    for name, cost in costed.nodes.items():
        if cost.forward_bytes and graph.decision(name).kind in (OP, INPUT):
            forward["activations"] += cost.forward_bytes[choice[name]]
    moved = [(u, v, edge, edge.forward_bytes) for (u, v, _), edge in costed.edges.items() if edge.forward_bytes]
    order = {name: i for i, name in enumerate(graph.nodes)}
    heaviest = max((v for _, v, _, _ in moved), key=order.__getitem__, default=None)  # every other reader runs before it
    for u, v, edge, forward_bytes in moved:
        held = forward_bytes[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
        forward["temporaries" if v == heaviest else "activations"] += held
    if checkpointed is not None:
        freed = freed_bytes(costed, choice, checkpointed.freed, checkpointed.share, checkpointed.mode, checkpointed.decisions,
                            checkpointed.inputs, checkpointed.layers)
        start["activations"] -= freed
        forward["activations"] -= freed
    peak = max(start, end, forward, key=lambda split: sum(split.values()))
    return {key: int(value) for key, value in peak.items()}


def _call_layout(costed: CostedGraph, choice, call: ModuleCall, output_spec, order) -> ModuleLayout:
    """Inputs: the spec the first op inside the module asks for; outputs: the spec produced
    (an input handed back: the spec its input hook made)."""
    graph = costed.choices.graph
    owners = costed.choices.traced.node_modules

    def inside(node: str) -> bool:
        return within(owners.get(node, ""), call.fqn)

    inputs = {}
    passed: dict[tuple[str, int], tuple] = {}  # value -> the layout the module's input hook gives it
    for key, node in call.inputs:
        source, out_index = costed.choices.traced.value_of(node)
        if source not in graph:
            continue
        consumers = sorted(
            (order[v], v, k)
            for _, v, k, read in graph.reads(source)
            if read == out_index and inside(v)
        )
        if consumers:
            _, v, k = consumers[0]
            found = through_views(graph, choice, v, k, inside)
            inputs[key] = found[1] if found is not None else graph.decision(v).strategies[choice[v]].inputs[k]
            passed.setdefault((source, out_index), inputs[key])
    outputs = {}
    for key, node in call.outputs:
        source, out_index = costed.choices.traced.value_of(node)
        if (source, out_index) in passed:
            # an input handed back as it came (T5's attention returns the position bias it
            # was given): it leaves as its input hook laid it out, moving nothing
            outputs[key] = passed[(source, out_index)]
        elif source in graph:
            reshaped = _reshaped_outside(graph, owners, choice, source, out_index, call.fqn)
            outputs[key] = reshaped or output_spec(source, out_index)
    return ModuleLayout(inputs, outputs)


def _reshaped_outside(graph, owners, choice, source: str, out_index: int, fqn: str):
    """The layout the readers outside a module read its output in, where they are all
    reshaping views (``views.reshaping_readers``) reading one layout other than the one
    the module makes, or None. Falcon's fused q/k/v, split by columns on tp, is viewed as
    ``num_heads + 2`` heads, 6 on a tiny config, which 4 ranks cannot split."""
    readers = reshaping_readers(graph, owners, source, out_index, fqn)
    wanted = {graph.decision(v).strategies[choice[v]].inputs[k] for v, k in readers}
    made = graph.decision(source).strategies[choice[source]].output(out_index)
    return wanted.pop() if len(wanted) == 1 and made not in wanted else None
