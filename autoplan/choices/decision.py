"""The choice graph's data, typed: one ``Decision`` per node, one read per edge.

``DecisionGraph`` is the networkx graph the later stages walk (predecessors, degrees,
graph order), with typed accessors in place of string-keyed attribute dicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import networkx as nx
from torch import fx

from autoplan.dtensor.strategies import Strategy


@dataclass(frozen=True, slots=True)
class Decision:
    """One value the planner lays out, and the strategies it may take."""

    name: str
    """The traced node's name, which is also the decision's node in the graph."""
    kind: str
    """What the value is: parameter, buffer, input, op, constant or fallback (``choices/graph.py``)."""
    fx_node: fx.Node
    """The traced node; its ``meta["val"]`` holds the value's fake tensor(s)."""
    module: str
    """FQN of the module that computes or owns the value ("" for the root)."""
    strategies: tuple[Strategy, ...]
    """The candidates; a solution picks one by index. Repeated layers share one tuple per
    op signature (``choices/graph.py``'s cache), which the cost stage's caches rely on."""
    requires_grad: bool
    """Whether the value carries a gradient in backward."""


class DecisionGraph(nx.MultiDiGraph):
    """Decisions as nodes, in graph order; edges run producer -> consumer, keyed by the
    consumer's tensor-input index, and record which output of the producer they read."""

    def add_decision(self, decision: Decision) -> None:
        self.add_node(decision.name, decision=decision)

    def add_read(self, producer: str, consumer: str, input_index: int, out_index: int) -> None:
        self.add_edge(producer, consumer, key=input_index, out_index=out_index)

    def decision(self, name: str) -> Decision:
        return self._node[name]["decision"]

    def decisions(self) -> Iterator[Decision]:
        """Every decision, in graph order (producers before consumers)."""
        return (data["decision"] for data in self._node.values())

    def reads(self, producer: str | None = None) -> Iterator[tuple[str, str, int, int]]:
        """``(producer, consumer, input index, producer output index)`` for every edge, or
        for those leaving ``producer``, in graph order."""
        return iter(self.out_edges(producer, keys=True, data="out_index"))

    def out_index(self, producer: str, consumer: str, input_index: int) -> int:
        """Which output of ``producer`` input ``input_index`` of ``consumer`` reads."""
        return self._adj[producer][consumer][input_index]["out_index"]

    def inputs_of(self, name: str) -> list[tuple[str, int, int]]:
        """(producer, producer output index, input index) for each tensor input of ``name``."""
        found = [(u, i, k) for u, _, k, i in self.in_edges(name, keys=True, data="out_index")]
        return sorted(found, key=lambda item: item[2])
