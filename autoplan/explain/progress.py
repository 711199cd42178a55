"""Progress on stderr: a live status line for work that takes seconds or minutes (the
CLI's stages, with the time so far), and a bar of rows done for the benchmarks.

Where it goes follows ``AUTOPLAN_PROGRESS``: unset (``auto``), a terminal's stderr gets the
live line, which ``rich`` draws and clears when done, and a pipe or file (CI logs, tests)
gets nothing, so that a log holds no half-overwritten lines and an error stays the one
line on stderr; ``plain`` writes one plain line per stage or row instead, terminal or
not (for logs of long runs); ``off`` writes nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

ENVIRONMENT = "AUTOPLAN_PROGRESS"
MODES = ("auto", "plain", "off")


def progress_mode(stream) -> str:
    """"live", "plain" or "off" for ``stream``, per ``AUTOPLAN_PROGRESS`` (see the module docstring)."""
    asked = os.environ.get(ENVIRONMENT, "auto").strip().lower() or "auto"
    if asked == "off":
        return "off"
    if asked == "plain":
        return "plain"
    return "live" if _is_terminal(stream) else "off"


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


class _PlainLines:
    """``say(text)``: one line ``autoplan: [0:00:12] text`` on ``stream``, the time since the start."""

    def __init__(self, stream):
        self._stream = stream
        self._start = time.monotonic()

    def __call__(self, text: str) -> None:
        self._stream.write(f"autoplan: [{_clock(time.monotonic() - self._start)}] {text}\n")
        self._stream.flush()


@contextmanager
def progress_on_stderr(stream=None):
    """Yields ``say(text)``, which sets the status line's text (shown with the time so far);
    None where nothing is shown (``progress_mode`` "off": by default, a stderr that is not a
    terminal), so callers can leave progress out altogether."""
    stream = stream or sys.stderr
    mode = progress_mode(stream)
    if mode == "off":
        yield None
        return
    if mode == "plain":
        yield _PlainLines(stream)
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    line = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=Console(file=stream, force_terminal=True, highlight=False), transient=True)
    with line:
        task = line.add_task("starting", total=None)
        yield lambda text: line.update(task, description=text)


class RowProgress:
    """Rows done of a total, the rows running now and the time so far, on one live line.

    ``started(label)`` when a row begins (from any thread: rows may run side by side),
    ``finished(label)`` when it ends. With ``lines`` (a stream) instead of a bar, each
    finished row is one plain line; quiet (neither), both do nothing."""

    def __init__(self, total: int, bar=None, lines=None, what: str = "rows"):
        self.total = total
        self._bar = bar
        self._lines = lines
        self._what = what
        self._done = 0
        self._start = time.monotonic()
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
        if self._lines is not None:
            with self._lock:
                self._done += 1
                self._lines.write(f"autoplan: [{_clock(time.monotonic() - self._start)}] "
                                  f"{self._done}/{self.total} {self._what}: {label} done\n")
                self._lines.flush()
            return
        if self._bar is None:
            return
        with self._lock:
            if label in self._running:
                self._running.remove(label)
            self._bar.update(self._task, advance=1, now=", ".join(self._running))


@contextmanager
def rows_on_stderr(total: int, what: str = "rows", stream=None):
    """Yields a ``RowProgress`` for a benchmark's ``total`` rows: a bar with rows done /
    total, elapsed time and the rows running now on stderr when it is a terminal; one line
    per row done with ``AUTOPLAN_PROGRESS=plain``; a quiet one otherwise.

    While the bar is up, what the benchmark prints goes through the bar's console, above the
    bar, so a row line never lands in the middle of it: stderr always; stdout only when it is
    a terminal too (redirected to a file, stdout is left alone and keeps every row). That
    holds for ``print`` and writes to ``sys.stdout``; a ``rich`` console of the caller's own
    writes past the bar's proxy, so render its lines first (``hf_coverage.Printer``)."""
    stream = stream or sys.stderr
    mode = progress_mode(stream)
    if mode != "live":
        yield RowProgress(total, lines=stream if mode == "plain" else None, what=what)
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
