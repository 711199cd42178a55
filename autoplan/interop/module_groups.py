"""Module names grouped for reading: identical rows of repeated layers become one row,
``model.layers.0-15.mlp.gate_proj``, instead of sixteen."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

V = TypeVar("V")

_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dotted component that is an integer


def group_modules(rows: Mapping[str, V]) -> list[tuple[str, V]]:
    """(label, value) rows, in name order: names that differ only in one integer component
    and carry equal values share a row, the indices written as ranges (``0-15``, ``0-3,5``)."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    order: list[tuple[str, str]] = []
    for name in sorted(rows, key=_natural):
        indices = list(_INDEX.finditer(name))
        if not indices:
            key = (name, repr(rows[name]))
            groups.setdefault(key, []).append((-1, name))
            order.append(key) if len(groups[key]) == 1 else None
            continue
        last = indices[0]  # the outermost index: layers.N
        pattern = name[: last.start()] + "{}" + name[last.end():]
        key = (pattern, repr(rows[name]))
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append((int(last.group()), name))
    out: list[tuple[str, V]] = []
    for key in order:
        members = groups[key]
        value = rows[members[0][1]]
        if len(members) == 1:
            out.append((members[0][1] or "<root>", value))
        else:
            out.append((key[0].format(_ranges(sorted(i for i, _ in members))), value))
    return out


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


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
