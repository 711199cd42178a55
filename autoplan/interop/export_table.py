"""The terminal view of a torch export: one row per module (repeated layers grouped), with
its style on tp, its wrapper on dp and what differs from the plan."""

from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table

from autoplan.interop.export_result import TorchExport
from autoplan.interop.module_groups import group_modules
from autoplan.plan.module_plan import Plan


def _style_name(style: str) -> str:
    """``ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1))`` -> ``Colwise -> Shard(-1)``."""
    kind = style.split("Parallel", 1)[0]
    into = re.search(r"input_layouts=([^,)]+\)?)", style)
    out = re.search(r"output_layouts=([^,)]+\)?)", style)
    return f"{kind} {into.group(1) if into else ''} -> {out.group(1) if out else ''}".replace("Replicate()", "R")


def export_rows(plan: Plan, export: TorchExport) -> list[tuple[str, str, str, str]]:
    dp = export.data_parallel
    wrappers: dict[str, str] = {}
    if dp:
        for m in dp.replicate:
            wrappers[m] = "replicate"
        dims = {fqn.rpartition(".")[0]: d for fqn, d in dp.shard_dims.items()}
        for m in dp.fully_shard:
            wrappers[m] = "fully_shard" + (f" (dim {dims[m]})" if m in dims else "")
        if "" in dp.fully_shard and any(f.rpartition(".")[0] not in dp.fully_shard for f in dp.shard_dims):
            wrappers[""] = "fully_shard (" + ", ".join(f"{f} dim {d}" for f, d in sorted(dp.shard_dims.items())) + ")"
    modules = set(export.styles) | set(wrappers) | set(export.differences)
    rows = {
        m: (_style_name(export.styles[m]) if m in export.styles else "", wrappers.get(m, ""),
            "; ".join(export.differences.get(m, ())) or "")
        for m in modules
    }
    return [(label, *value) for label, value in group_modules(rows)]


def print_export_table(plan: Plan, export: TorchExport, console: Console | None = None) -> None:
    console = console or Console(width=200, soft_wrap=False)
    table = Table(title="what the export writes", title_justify="left", show_lines=False)
    table.add_column("module")
    table.add_column(f"on {export.tp_axis}" if export.tp_axis else "tp")
    table.add_column(f"on {export.dp_axis}" if export.dp_axis else "dp")
    table.add_column("differs from the plan", overflow="fold")
    for label, style, wrapper, differs in export_rows(plan, export):
        table.add_row(label, style, wrapper, differs or "-")
    console.print(table)
