"""A live status line on stderr for work that takes seconds, only when stderr is a terminal.

Piped or redirected (CI logs, tests), nothing is written: a log gets no half-overwritten
lines. ``rich``'s status spinner draws on the terminal and clears itself when done.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_on_stderr(stream=None):
    """Yields ``say(text)``, which sets the status line's text; None when ``stream`` (stderr)
    is not a terminal, so callers can leave progress out altogether."""
    stream = stream or sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal:
        yield None
        return
    from rich.console import Console

    console = Console(file=stream)
    with console.status("starting") as status:
        yield lambda text: status.update(text)
