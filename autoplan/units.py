"""Units and how figures are written for people: milliseconds, bytes in binary units.

Memory is printed in binary units (GiB = 2**30 bytes) and always labelled so; a budget
the user gives in decimal GB (10**9 bytes) keeps its unit where it is printed
(``pipeline/budget.py``).
"""

from __future__ import annotations

GIB = 2**30
"""A gibibyte: what devices report their memory in."""
GB = 10**9
"""A gigabyte, as ``--memory-gb`` means it."""


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def nbytes(count: float | None) -> str:
    if count is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"
