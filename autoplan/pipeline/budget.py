"""The per-device memory budget: which one, in bytes, and how to say it.

A budget is given in decimal gigabytes (``--memory-gb`` / ``memory_gb``: 10**9 bytes) or
in binary gibibytes (``--memory-gib`` / ``memory_gib``: 2**30 bytes, what devices report),
never both. Without one, ``score`` and ``explain`` judge a plan against the budget it was
made under (``Plan.solver.memory_budget_bytes``), and ``suggest`` plans for the profile's
device memory. Wherever a budget is printed it says which it is, in the unit it was given
and in bytes (and GiB): ``40 GB (40,000,000,000 bytes = 37.25 GiB), given``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.errors import OptionError
from autoplan.pipeline.arguments import check_positive
from autoplan.units import GB, GIB

GIVEN = "given"
PLANS_OWN = "the budget the plan was made under"
PROFILES = "the profile's device memory"


@dataclass(frozen=True)
class MemoryBudget:
    bytes: float
    """Per device; ``inf`` for none."""
    given: str | None = None
    """As the user wrote it ("40 GB", "0.015 GiB"); None when not given."""
    source: str = GIVEN
    """Where it comes from: ``GIVEN``, ``PLANS_OWN`` or ``PROFILES``."""

    def amount(self) -> str:
        """The budget in the unit it was given, with its bytes: "40 GB (40,000,000,000 bytes
        = 37.25 GiB)", "0.015 GiB (16,106,127 bytes)"; not given: "37.25 GiB (40,000,000,000 bytes)"."""
        if math.isinf(self.bytes):
            return "no budget"
        count = f"{round(self.bytes):,} bytes"
        if self.given is None:
            return f"{self.bytes / GIB:.4g} GiB ({count})"
        if self.given.endswith(" GiB"):
            return f"{self.given} ({count})"
        return f"{self.given} ({count} = {self.bytes / GIB:.4g} GiB)"

    def describe(self) -> str:
        """The amount and where it comes from: "40 GB (...), given"."""
        return f"{self.amount()}, {self.source}"


def _written(value: float) -> str:
    return f"{value:.15g}"


def given_budget(memory_gb=None, memory_gib=None) -> MemoryBudget | None:
    """The budget from the user's ``memory_gb`` (10**9 bytes) or ``memory_gib`` (2**30
    bytes), checked with the command line's rules; None when neither is given."""
    if memory_gb is not None and memory_gib is not None:
        raise OptionError(
            f"got both memory_gb={memory_gb!r} and memory_gib={memory_gib!r}",
            hint="give the budget once: memory_gb in GB (10**9 bytes) or memory_gib in GiB (2**30 bytes)",
        )
    memory_gb = check_positive("memory_gb", memory_gb)
    memory_gib = check_positive("memory_gib", memory_gib)
    if memory_gb is not None:
        return MemoryBudget(memory_gb * GB, f"{_written(memory_gb)} GB")
    if memory_gib is not None:
        return MemoryBudget(memory_gib * GIB, f"{_written(memory_gib)} GiB")
    return None


def plans_budget(plan) -> MemoryBudget | None:
    """The budget ``plan`` was made under, where its file records one."""
    recorded = plan.solver.memory_budget_bytes
    return None if recorded is None else MemoryBudget(float(recorded), None, PLANS_OWN)


def profiles_budget(profile) -> MemoryBudget:
    """A ClusterProfile's device memory: ``suggest``'s default budget."""
    return MemoryBudget(float(profile.memory_bytes), None, PROFILES)


def budget_words(budget_bytes: float, budget: MemoryBudget | None = None) -> str:
    """``budget.describe()`` where ``budget`` is the budget of ``budget_bytes``, else the
    bytes in GiB and bytes (a budget replaced after it was resolved: ``explain``'s unbounded solve)."""
    if budget is not None and budget.bytes == budget_bytes:
        return budget.describe()
    return MemoryBudget(budget_bytes, None, "").amount()
