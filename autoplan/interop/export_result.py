"""What ``export_torch`` returns: the generated module and what it does unlike the plan.

A module of its own because the renderer, the scorer and the table read it, and
``export_torch`` (which builds it) calls the renderer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.interop.export_data_parallel import DataParallelExport


@dataclass(frozen=True, slots=True)
class TorchExport:
    source: str
    """The generated Python module."""
    styles: dict[str, str]
    """Module FQN -> ParallelStyle expression, on the tp axis."""
    fsdp_modules: tuple[str, ...]
    """Modules wrapped with ``fully_shard`` on the dp axis, the root ("") last."""
    not_expressed: tuple[str, ...]
    """One line per part of the plan the export does not reproduce."""
    tp_axis: str | None
    dp_axis: str | None
    data_parallel: DataParallelExport | None = None
    tp_stored: dict[str, str] = field(default_factory=dict)
    """Parameter FQN -> its placement on tp once the styles hold it ("R" where no style)."""
    replicated_boundaries: tuple[tuple[str, str, str], ...] = ()
    """(module, "input" | "output", key path) the plan splits on tp and the export keeps whole."""
    differences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Module FQN ("" the root) -> what the export does there unlike the plan."""
    details: tuple[str, ...] = ()
    """One line per activation layout on tp the export changes (for the generated file)."""
