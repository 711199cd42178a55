"""Chains of views between a value and the op that computes with it.

A linear's weight reaches its matmul through ``t()``, a 3-D activation through a reshape.
The plan records the layout a module input or a parameter must have for its first
compute op, which is the layout at the start of such a chain; the solver's strategies
say which layout each view maps to which.
"""

from __future__ import annotations

from autoplan.choices.graph import OP
from autoplan.cost.estimate import is_view
from autoplan.dtensor.view_rules import RESHAPING_VIEWS


def view_chain(graph, consumer: str, key: int, inside=lambda node: True) -> list[tuple[str, int]]:
    """``[(node, input index), ...]`` from input ``key`` of ``consumer`` down its single-reader
    views to the first op that is not a view (or whose next reader is not ``inside``)."""
    chain = [(consumer, key)]
    while is_view(graph.decision(chain[-1][0])) and graph.out_degree(chain[-1][0]) == 1:
        _, after, after_key = next(iter(graph.out_edges(chain[-1][0], keys=True)))
        if not inside(after):
            break
        chain.append((after, after_key))
    return chain


def spec_before_views(graph, chain, wanted):
    """The layout at the start of ``chain`` that its views turn into ``wanted`` (the last
    node's input layout); None if no view strategy gives it."""
    layouts = layouts_along_views(graph, chain, wanted)
    return None if layouts is None else layouts[0]


def layouts_along_views(graph, chain, wanted) -> list | None:
    """The layout each node of ``chain`` reads for its views to turn the first into
    ``wanted`` (the last node's input layout, the list's last); None if no view strategy
    gives it."""
    layouts = [wanted]
    for view, _ in reversed(chain[:-1]):
        layout = next((s.inputs[0] for s in graph.decision(view).strategies if s.outputs[0] == layouts[0]), None)
        if layout is None:
            return None
        layouts.insert(0, layout)
    return layouts


def spec_after_views(graph, chain, spec):
    """What ``chain``'s views turn the layout ``spec`` into at its last node; None if a view
    has no strategy taking it."""
    layouts = layouts_after_views(graph, chain, spec)
    return None if layouts is None else layouts[-1]


def layouts_after_views(graph, chain, spec) -> list | None:
    """The layout each node of ``chain`` reads when its first reads ``spec`` and each view
    runs on what it gets; None if a view has no strategy taking it."""
    layouts = [spec]
    for view, _ in chain[:-1]:
        spec = next((s.outputs[0] for s in graph.decision(view).strategies if s.inputs[0] == spec), None)
        if spec is None:
            return None
        layouts.append(spec)
    return layouts


def reshaping_readers(graph, owners: dict, source: str, out_index: int, fqn: str) -> list[tuple[str, int]]:
    """``[(reader, input index), ...]`` of the output of module ``fqn`` where every reader
    outside the module is a reshaping view in a module enclosing it (no input hook of
    another module between them); [] otherwise. DTensor moves an op's inputs to the layout
    its strategy wants, but not a view's: its rule takes the input as it comes and refuses
    a split it cannot carry through the reshape, so such an output is handed over in the
    layout the views read (the module's output hook moves it; ``plan/builder.py``,
    ``pipeline/pinning.py``). ``owners``: node -> the FQN of the module it runs in."""

    def encloses(node: str) -> bool:
        owner = owners.get(node) or ""
        return owner == "" or fqn.startswith(owner + ".")

    readers = [
        (v, k) for _, v, k, read in graph.reads(source) if read == out_index and not within(owners.get(v) or "", fqn)
    ]
    fits = all(
        encloses(v) and graph.decision(v).kind == OP and graph.decision(v).fx_node.target in RESHAPING_VIEWS
        for v, _ in readers
    )
    return readers if fits else []


def within(owner: str, fqn: str) -> bool:
    """Whether module ``owner`` is module ``fqn`` or inside it."""
    return owner == fqn or owner.startswith(fqn + ".")
