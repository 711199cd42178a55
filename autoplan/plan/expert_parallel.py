"""Expert parallel in a plan: which modules are experts, and their layout split over one axis.

Which modules are experts is a general rule (``trace/experts.py``).

``with_expert_parallel`` lays such a plan out expert parallel over one mesh axis: each
expert weight is stored ``Shard(0)`` on that axis (each rank holds ``E/n`` experts) and
replicated on the others, and ``Plan.expert_parallel`` names the modules; the apply engine
(``apply/expert_parallel.py``) then sends each token to the rank that holds its expert and
back with ``all_to_all`` (variable splits, the counts the router decides at run time).
``predicted_all_to_alls`` prices that exchange with the router's load taken as even.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from autoplan.choices.expert_layouts import expert_axis, expert_count, is_expert_region
from autoplan.errors import PlanError
from autoplan.plan.module_plan import Plan
from autoplan.trace.experts import GROUPED, ROUTED, find_experts

EXPERT_NOTE = "expert parallel:"
"""How the warning line begins that compares the experts' layouts (``pipeline/expert_choice.py``)."""


def with_expert_parallel(plan: Plan, model: nn.Module, axis: str) -> Plan:
    """``plan`` with every experts module of ``model`` split over mesh axis ``axis``.

    Expert weights are stored ``Shard(0)`` on ``axis`` and replicated elsewhere (their
    gradients summed over the axes that split the tokens); the modules' own input and
    output layouts and parameter uses are dropped, since the engine lays their tokens out
    itself. Raises a PlanError where the model has no experts module or ``E`` does not
    divide by the axis's size.
    """
    if axis not in plan.axis_names:
        raise PlanError(f"expert parallel over axis {axis!r}: the plan's mesh has axes {list(plan.axis_names)}",
                        hint="name one of the plan's mesh axes")
    index = plan.axis_names.index(axis)
    size = plan.mesh_shape[index]
    experts = find_experts(model)
    if not experts:
        raise PlanError("expert parallel: the model has no experts module (parameters all 3-D with one leading "
                        "size, called with (tokens, top-k index, top-k weights) or (grouped tokens, counts))",
                        hint="plan it without expert parallel")
    parameters = dict(plan.parameters)
    uses = dict(plan.parameter_uses)
    modules = dict(plan.modules)
    layouts = {}
    for found in experts:
        if found.experts % size:
            raise PlanError(f"expert parallel: {found.fqn} has {found.experts} experts, which the {size} ranks of "
                            f"axis {axis!r} cannot split evenly", hint="choose an axis whose size divides the experts")
        module = model.get_submodule(found.fqn)
        for name, _ in module.named_parameters(recurse=False):
            fqn = f"{found.fqn}.{name}" if found.fqn else name
            parameters[fqn] = tuple("S(0)" if i == index else "R" for i in range(len(plan.mesh_shape)))
            uses.pop(fqn, None)
        modules.pop(found.fqn, None)
        if found.call == GROUPED:
            modules.pop(parent_of(found.fqn), None)
        layouts[found.fqn] = {"axis": axis, "experts": found.experts, "call": found.call}
    opaque = tuple(m for m in plan.opaque_modules if m not in layouts)
    return replace(plan, parameters=parameters, parameter_uses=uses, modules=modules,
                   opaque_modules=opaque, expert_parallel=layouts)


def solved_expert_layouts(choices, choice: dict[str, int]) -> dict[str, dict]:
    """FQN -> ``Plan.expert_parallel`` entry of each experts region (``choices/expert_layouts.py``)
    whose chosen strategy splits its experts over an axis; regions laid out whole are absent."""
    layouts = {}
    for decision in choices.graph.decisions():
        node = decision.fx_node
        if not is_expert_region(node, choices.traced.opaque_reasons):
            continue
        axis = expert_axis(decision.strategies[choice[decision.name]])
        if axis is not None:
            layouts[str(node.args[0])] = {"axis": choices.axis_names[axis], "experts": expert_count(node), "call": ROUTED}
    return layouts


def expert_rows(plan: Plan) -> tuple[tuple[str, str, str, str], ...]:
    """(modules, axis, experts per rank, call) per expert layout, repeated layers folded
    (``model.layers.*.mlp.experts (61)``): what ``show`` and ``explain`` list."""
    import re

    folded: dict[tuple, int] = {}
    for fqn, layout in sorted(plan.expert_parallel.items()):
        size = plan.mesh_shape[plan.axis_names.index(layout["axis"])]
        key = (re.sub(r"\.\d+\.", ".*.", fqn), layout["axis"], f"{layout['experts'] // size} of {layout['experts']}",
               layout["call"])
        folded[key] = folded.get(key, 0) + 1
    return tuple((f"{name} ({count})" if count > 1 else name, axis, per_rank, call)
                 for (name, axis, per_rank, call), count in folded.items())


def expert_notes(plan: Plan) -> tuple[str, ...]:
    """The plan's warning lines that compare the experts' layouts."""
    return tuple(w for w in plan.warnings if w.startswith(EXPERT_NOTE))


def parent_of(fqn: str) -> str:
    return fqn.rpartition(".")[0]


def even_load_all_to_all_bytes(tokens: int, top_k: int, hidden: int, dtype_bytes: int, ranks: int) -> float:
    """Bytes one rank sends in one dispatch (or one combine) of ``tokens`` local tokens,
    each to ``top_k`` experts, the router's load taken as even: of every rank's
    ``tokens * top_k`` rows of ``hidden`` values, the share ``(n-1)/n`` goes to other ranks."""
    return tokens * top_k * hidden * dtype_bytes * (ranks - 1) / ranks
