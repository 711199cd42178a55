"""A line per test file as its last test finishes, and the slowest files at the end.

pytest's own progress under xdist is a row of dots (``-q`` or not), which says nothing of
which file is running or which one is slow; ``--durations`` names tests, not files. This
plugin (registered by ``conftest.py``) prints, as each file completes, its tests' outcome
and their summed time (setup, call and teardown), then the slowest files in the terminal
summary. It reads only reports, so it changes no test's outcome.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

SLOWEST_FILES = 15
"""How many files the summary lists."""


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileProgress:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.expected: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.failed: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.collected = False

    @property
    def terminal(self):
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def _expect(self, nodeids) -> None:
        if not self.collected:  # every xdist worker collects the same tests: count them once
            self.collected = True
            self.expected.update(_file_of(nodeid) for nodeid in nodeids)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        if not hasattr(self.config, "workerinput"):  # an xdist worker reports through the controller
            self._expect(item.nodeid for item in items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self._expect(ids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(self.config, "workerinput"):
            return
        path = _file_of(report.nodeid)
        self.seconds[path] += report.duration
        if report.failed:
            self.failed[path] += 1
        elif report.skipped:  # at setup (a skip mark, importorskip) or in the call
            self.skipped[path] += 1
        if report.when != "teardown":
            return
        self.finished[path] += 1
        if self.finished[path] == self.expected.get(path) and self.terminal is not None:
            self.terminal.ensure_newline()
            self.terminal.write_line(f"{path}: {self._outcome(path)} in {self.seconds[path]:.1f} s")

    def _outcome(self, path: str) -> str:
        """"7 passed, 2 skipped, 1 FAILED" of a file's tests (a test failing in setup and teardown counts once)."""
        failed, skipped = min(self.failed[path], self.finished[path]), self.skipped[path]
        passed = self.finished[path] - failed - skipped
        parts = [f"{passed} passed"] + ([f"{skipped} skipped"] if skipped else []) + ([f"{failed} FAILED"] if failed else [])
        return ", ".join(parts)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if hasattr(self.config, "workerinput") or not self.seconds:
            return
        terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} files (setup + call + teardown, summed)")
        for path, seconds in sorted(self.seconds.items(), key=lambda item: -item[1])[:SLOWEST_FILES]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
