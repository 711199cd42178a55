"""Module names grouped for reading: identical rows of repeated layers become one row,
``model.layers.0-15.mlp.gate_proj``, instead of sixteen."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from autoplan.explain.patterns import fold

V = TypeVar("V")


@dataclass(frozen=True)
class _Row(Generic[V]):
    """A named value, as ``patterns.fold`` folds rows (``name``, ``count``)."""

    name: str
    value: V
    count: int = 1


def group_modules(rows: Mapping[str, V]) -> list[tuple[str, V]]:
    """(label, value) rows, in name order: consecutive repeated layers (names that differ
    only in their block index) with equal values share a row, ``model.layers.0-15.mlp``,
    folded as ``show`` folds its module table (``explain/patterns.fold``)."""
    folded = fold([_Row(name, value) for name, value in rows.items()], key=lambda row: repr(row.value))
    return [(row.name or "<root>", row.value) for row in folded]


def group_notes(notes: Iterable[str], names: set[str]) -> list[str]:
    """Notes that open with one of ``names`` (``"model.layers.3.mlp.up_proj.weight: ..."``)
    merged across repeated layers, one line per group; the others as they are."""
    keyed: dict[str, tuple[str, ...]] = {}
    plain = []
    for note in notes:
        head = note.split(": ", 1)[0].split(" (", 1)[0]
        if head in names:
            keyed[head] = keyed.get(head, ()) + (note[len(head):],)
        else:
            plain.append(note)
    return plain + [label + "".join(text) for label, text in group_modules(keyed)]
