"""Progress on stderr, only when stderr is a terminal: a live status line for work that
takes seconds (the CLI's stages), and a bar of rows done for the benchmarks that run for
minutes.

Piped or redirected (CI logs, tests), nothing is written: a log gets no half-overwritten
lines. ``rich`` draws both on the terminal and clears them when done.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager


@contextmanager
def progress_on_stderr(stream=None):
    """Yields ``say(text)``, which sets the status line's text; None when ``stream`` (stderr)
    is not a terminal, so callers can leave progress out altogether."""
    stream = stream or sys.stderr
    if not _is_terminal(stream):
        yield None
        return
    from rich.console import Console

    console = Console(file=stream)
    with console.status("starting") as status:
        yield lambda text: status.update(text)


class RowProgress:
    """Rows done of a total, the rows running now and the time so far, on one live line.

    ``started(label)`` when a row begins (from any thread: rows may run side by side),
    ``finished(label)`` when it ends. Quiet (``bar`` None), both do nothing."""

    def __init__(self, total: int, bar=None):
        self.total = total
        self._bar = bar
        self._task = bar.add_task("", total=total, now="") if bar is not None else None
        self._running: list[str] = []
        self._lock = threading.Lock()

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn (stderr is a terminal): work done only to feed it can be skipped."""
        return self._bar is not None

    def started(self, label: str) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._running.append(label)
            self._bar.update(self._task, now=", ".join(self._running))

    def finished(self, label: str) -> None:
        if self._bar is None:
            return
        with self._lock:
            if label in self._running:
                self._running.remove(label)
            self._bar.update(self._task, advance=1, now=", ".join(self._running))


@contextmanager
def rows_on_stderr(total: int, what: str = "rows", stream=None):
    """Yields a ``RowProgress`` for a benchmark's ``total`` rows: a bar with rows done /
    total, elapsed time and the rows running now on stderr when it is a terminal; a quiet one
    otherwise.

    While the bar is up, what the benchmark prints goes through the bar's console, above the
    bar, so a row line never lands in the middle of it: stderr always; stdout only when it is
    a terminal too (redirected to a file, stdout is left alone and keeps every row). That
    holds for ``print`` and writes to ``sys.stdout``; a ``rich`` console of the caller's own
    writes past the bar's proxy, so render its lines first (``hf_coverage.Printer``)."""
    stream = stream or sys.stderr
    if not _is_terminal(stream):
        yield RowProgress(total)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        BarColumn(), MofNCompleteColumn(), TextColumn(what), TimeElapsedColumn(), TextColumn("{task.fields[now]}"),
        console=Console(file=stream, force_terminal=True, highlight=False),
        transient=True, redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=True,
    )
    with bar:
        yield RowProgress(total, bar)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
