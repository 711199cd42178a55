"""Module calls' hooks, as the apply engine runs them: which input hooks move a value
(each inside the enclosing one it receives the value from), which boundary a reader sits
behind, and which output hooks put a value a module returns in the plan's layout (and how
the gradient of an output its own module also reads comes back). ``plan/collectives.py``
predicts the moves of all three."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autoplan.cost.comm import gradient_collectives, without_partial
from autoplan.plan.gradient_rules import summed
from autoplan.plan.module_plan import ROOT_MODULE as ROOT
from autoplan.plan.views import within


@dataclass(eq=False)
class Boundary:
    """A module call's input hook moving one value to the plan's layout."""

    value: tuple[str, int]
    fqn: str
    spec: tuple
    parent: Boundary | None = None

    @property
    def depth(self) -> int:
        return self.fqn.count(".") + 1


def planned_calls(choices, modules: dict):
    """``(call, layout)`` for each call of a module the plan lays out (the root's layout is
    the batch's, not a hook's)."""
    for call in choices.traced.module_calls:
        layout = modules.get(call.fqn)
        if layout is not None and call.fqn != "":
            yield call, layout


def module_boundaries(choices, modules: dict) -> dict[tuple[str, int], list[Boundary]]:
    """Per value: the module input hooks that move it (``apply._redistribute_inputs``), each
    with the enclosing one it receives the value from (None: from its producer)."""
    graph = choices.graph
    found: dict[tuple[str, int], list[Boundary]] = {}
    seen = set()
    for call, layout in planned_calls(choices, modules):
        for key, node in call.inputs:
            spec = layout.inputs.get(key)
            value = choices.traced.value_of(node)
            if spec is None or value[0] not in graph or (value, call.fqn) in seen:
                continue
            seen.add((value, call.fqn))
            found.setdefault(value, []).append(Boundary(value, call.fqn, tuple(spec)))
    for chain in found.values():
        for b in chain:
            enclosing = [a for a in chain if a is not b and within(b.fqn, a.fqn) and a.fqn != b.fqn]
            b.parent = max(enclosing, key=lambda a: a.depth) if enclosing else None
    return found


def crossed_boundary(chain, reader_module: str, producer_module: str):
    """The innermost boundary of ``chain`` the reader sits behind (None: it reads the value
    as its producer left it). A boundary of a module that made the value is not crossed."""
    owner = "" if reader_module == ROOT else reader_module
    inner = [b for b in chain if within(owner, b.fqn) and not within(producer_module, b.fqn)]
    return max(inner, key=lambda b: b.depth) if inner else None


def output_nodes(choices, modules: dict) -> set[str]:
    """Nodes a planned module returns (its output hook puts them in the plan's layout)."""
    return {
        choices.traced.value_of(node)[0]
        for call, layout in planned_calls(choices, modules)
        for key, node in call.outputs
        if key in layout.outputs
    }


def output_hooks(choices, modules: dict) -> dict[tuple[str, int], list[tuple[str, tuple]]]:
    """Per value a module makes and returns: ``(module, layout)`` for each output hook that
    moves it, innermost first (the calls in the order they finish). A value a module was
    given and hands back is not its to move."""
    found: dict[tuple[str, int], list[tuple[str, tuple]]] = {}
    owners = choices.traced.node_modules
    for call, layout in planned_calls(choices, modules):
        for key, node in call.outputs:
            value = choices.traced.value_of(node)
            spec = layout.outputs.get(key)
            if spec is not None and value[0] in choices.graph and within(owners.get(value[0]) or "", call.fqn):
                found.setdefault(value, []).append((call.fqn, tuple(spec)))
    return found


def rejoined_outputs(hooked_outputs: dict, readers: dict, reached: set, module_of, made_by_op) -> dict:
    """value -> (its outermost output hook's module, that hook's layout, the layout DTensor
    made it in), for each module output a hook moves that is read in the backward both
    inside its innermost module and after its outermost (none in between). ``readers``:
    value -> its readers as ``plan/collectives.py`` lists them (the reading op first);
    ``made_by_op``: (op, output index) -> the layout the op made it in.

    The hook's backward brings the gradient of the readers after it back to the layout
    DTensor made, and autograd adds the inside readers' parts to that as they come, so
    nothing settles the sum in the plan's layout (Gemma 3n's decoder layer returns its
    AltUp stack, which its own ops read too)."""
    found = {}
    for (name, index), hooks in hooked_outputs.items():
        made_as = made_by_op(name, index)
        if all(layout == made_as for _, layout in hooks):
            continue
        taking = [module_of(r[0]) for r in readers.get((name, index), ()) if r[0] in reached]
        inside = [m for m in taking if within(m, hooks[0][0])]
        outside = [m for m in taking if not within(m, hooks[-1][0])]
        if inside and outside and len(inside) + len(outside) == len(taking):
            found[(name, index)] = (hooks[-1][0], hooks[-1][1], made_as)
    return found


def inside_only_outputs(hooked_outputs: dict, graph, reached: set, owners: dict) -> set[tuple[str, int]]:
    """The module outputs a hook moves whose gradient no reader after the innermost
    hooking module hands back, while some reader inside it does: no hook's backward
    runs for them (autograd calls it only with a gradient from outside), so the
    gradient meets its op's backward as the readers inside made it. ``hooked_outputs``:
    ``output_hooks``'; ``reached``: the ops the backward runs."""
    found = set()
    for (name, index), hooks in hooked_outputs.items():
        taking = [owners.get(v) or "" for _, v, _, read in graph.reads(name) if read == index and v in reached]
        if taking and all(within(m, hooks[0][0]) for m in taking):
            found.add((name, index))
    return found


def through_output_hook(parts: list, hook: tuple, nbytes: float, shape, mesh_shape, found: Counter, add=None) -> list:
    """``parts`` of a rejoined output's gradient (``rejoined_outputs``): those of the
    readers after the hook summed, settled in its layout and brought back by its backward
    to the layout DTensor made (that move is counted with the hook's forward), beside the
    inside readers' parts as they came."""
    fqn, layout, made_as = hook
    outside = [part for part in parts if not within(part[2], fqn)]
    if not outside:
        return parts
    grad = summed(outside, nbytes, mesh_shape, found, add)
    for kind, axis, size in gradient_collectives(grad, without_partial(layout), nbytes, mesh_shape, shape):
        found[(fqn, kind, axis, round(size))] += 1
    inside = [part for part in parts if within(part[2], fqn)]
    return inside + [(min(part[0] for part in outside), without_partial(made_as), fqn)]
