"""Tables on a terminal with ``rich``, plain aligned text everywhere else.

Every command of this package builds its output as ``Section``s (a title, column
headers, rows of strings, lines of notes) and renders them once, so the terminal table,
the plain text a pipe or a test reads, and the HTML report say the same thing. Plain
text is chosen when the stream is not a terminal: a file or a pipe gets no escape codes.
"""

from __future__ import annotations

import html
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Section:
    title: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = field(default=())
    right: tuple[int, ...] = ()
    """Columns aligned right (numbers)."""


def render(sections: list[Section], stream=None) -> None:
    """Write ``sections`` to ``stream`` (stdout): rich tables on a terminal, else plain text."""
    stream = stream or sys.stdout
    if _is_terminal(stream):
        _render_rich(sections, stream)
    else:
        stream.write(to_text(sections))


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def to_text(sections: list[Section]) -> str:
    lines: list[str] = []
    for section in sections:
        lines.append(section.title)
        if section.columns:
            table = [section.columns, *section.rows]
            widths = [max(len(row[i]) for row in table) for i in range(len(section.columns))]

            def line(row):
                cells = [
                    cell.rjust(w) if i in section.right else cell.ljust(w)  # noqa: B023 - called in this iteration
                    for i, (cell, w) in enumerate(zip(row, widths))  # noqa: B023 - called in this iteration
                ]
                return ("  " + "  ".join(cells)).rstrip()

            lines.append(line(section.columns))
            lines.extend(line(row) for row in section.rows)
        lines.extend(f"  {note}" for note in section.notes)
        lines.append("")
    return "\n".join(lines)


def _render_rich(sections: list[Section], stream) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Cells are Text, not markup: "[S(0), R]" and "[1]['input_ids']" are data.
    # Never narrower than the widest table: a truncated FQN or placement ("model.lay…")
    # says nothing; a terminal narrower than that wraps the lines instead.
    needed = max(
        (sum(max(len(r[i]) for r in (s.columns, *s.rows)) + 3 for i in range(len(s.columns))) + 1
         for s in sections if s.columns),
        default=0,
    )
    console = Console(file=stream, highlight=False)
    console = Console(file=stream, highlight=False, width=max(console.width, needed))
    for section in sections:
        if section.columns:
            table = Table(title=Text(section.title, style="bold"), title_justify="left")
            for i, column in enumerate(section.columns):
                table.add_column(Text(column), justify="right" if i in section.right else "left")
            for row in section.rows:
                table.add_row(*(Text(cell) for cell in row))
            console.print(table)
        else:
            console.print(Text(section.title, style="bold"))
        for note in section.notes:
            console.print("  " + note, markup=False)
        console.print()


def to_html(sections: list[Section]) -> str:
    """The sections as HTML tables (for the report)."""
    parts = []
    for section in sections:
        parts.append(f"<h3>{html.escape(section.title)}</h3>")
        if section.columns:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in section.columns)
            body = "".join(
                "<tr>" + "".join(
                    f'<td class="{"num" if i in section.right else ""}">{html.escape(cell)}</td>' for i, cell in enumerate(row)
                ) + "</tr>"
                for row in section.rows
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        if section.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in section.notes) + "</ul>")
    return "\n".join(parts)
