"""Expert parallel in a plan: which modules are experts, and their layout split over one axis.

An *experts module* is recognised by a general rule, not by its class name: every
parameter it holds directly has the same leading size ``E >= 2`` and at least one is 3-D
(a matrix per expert; the others a bias per expert, as gpt-oss's), it has no child module
with parameters, and its ``forward`` takes the tokens in one of the two forms
mixture-of-experts code calls its experts with (its positional parameters, defaults or not):

- **routed** (three tensors: tokens ``(T, H)``, top-k expert index ``(T, k)``, top-k
  weights ``(T, k)``), as HuggingFace transformers' experts modules take them
  (``@use_experts_implementation``); their output is ``sum_k w_k * expert_k(token)``;
- **grouped** (two tensors: tokens already sorted by expert ``(N, H)``, tokens per expert
  ``(E,)``), as torchtitan's grouped experts take them; the module that calls them (their
  parent) sorts, weights and sums, and holds no parameters of its own.

``with_expert_parallel`` lays such a plan out expert parallel over one mesh axis: each
expert weight is stored ``Shard(0)`` on that axis (each rank holds ``E/n`` experts) and
replicated on the others, and ``Plan.expert_parallel`` names the modules; the apply engine
(``apply/expert_parallel.py``) then sends each token to the rank that holds its expert and
back with ``all_to_all`` (variable splits, the counts the router decides at run time).
``predicted_all_to_alls`` prices that exchange with the router's load taken as even.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

from torch import nn

from autoplan.errors import PlanError
from autoplan.plan.module_plan import Plan

EXPERT_NOTE = "expert parallel:"
"""How the warning line begins that compares the experts' layouts (``pipeline/expert_choice.py``)."""
ROUTED, GROUPED = "routed", "grouped"
"""How an experts module takes its tokens (see the module docstring)."""


@dataclass(frozen=True)
class ExpertsModule:
    fqn: str
    experts: int
    """E: the leading size of every parameter."""
    call: str
    """ROUTED or GROUPED."""


def experts_call(module: nn.Module) -> str | None:
    """ROUTED, GROUPED, or None: how ``module``'s forward takes tokens, by its signature."""
    try:
        signature = inspect.signature(module.forward)  # follows functools.wraps (transformers' decorator)
    except (TypeError, ValueError):
        return None
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_rest = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values())
    if has_rest:
        return None
    return {3: ROUTED, 2: GROUPED}.get(len(positional))


def find_experts(model: nn.Module) -> list[ExpertsModule]:
    """Every experts module of ``model`` (see the module docstring), in module order."""
    found = []
    for fqn, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if not params or any(True for child in module.children() for _ in child.parameters()):
            continue
        leading = {p.shape[0] if p.dim() else 0 for p in params}
        if len(leading) != 1 or not any(p.dim() == 3 for p in params) or next(iter(leading)) < 2:
            continue
        call = experts_call(module)
        if call is not None:
            found.append(ExpertsModule(fqn, int(next(iter(leading))), call))
    return found


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
