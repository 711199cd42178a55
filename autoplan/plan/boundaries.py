"""Module calls' hooks, as the apply engine runs them: which input hooks move a value
(each inside the enclosing one it receives the value from), which boundary a reader sits
behind, and which output hooks put a value a module returns in the plan's layout.
``plan/collectives.py`` predicts the moves of all three."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan.module_plan import ROOT_MODULE as ROOT
from autoplan.plan.views import within


@dataclass(eq=False)
class Boundary:
    """A module call's input hook moving one value to the plan's layout."""

    value: tuple[str, int]
    fqn: str
    spec: tuple
    parent: "Boundary | None" = None

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
