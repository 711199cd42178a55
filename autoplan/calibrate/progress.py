"""A plain-text progress bar on stderr, shown by rank 0 only.

On a terminal the bar redraws in place; in a log (stderr not a TTY) it prints one line
per tenth of the sweep instead, so that torchrun's captured output stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    """Counts the sweep's points; ``enabled=False`` (ranks other than 0) prints nothing."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None):
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._last_tenth = -1
        self._tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str) -> None:
        """One more point measured; ``label`` says which."""
        self.done = min(self.done + 1, self.total)
        if not self.enabled:
            return
        line = self._line(label)
        if self._tty:
            self.stream.write("\r" + line.ljust(100)[:100])
            if self.done == self.total:
                self.stream.write("\n")
        else:
            tenth = 10 * self.done // self.total
            if tenth == self._last_tenth:
                return
            self._last_tenth = tenth
            self.stream.write(line + "\n")
        self.stream.flush()

    def _line(self, label: str) -> str:
        filled = WIDTH * self.done // self.total
        bar = "#" * filled + "-" * (WIDTH - filled)
        elapsed = time.perf_counter() - self.start
        return f"calibrate [{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {label}"
