"""Under ``--dist loadfile``, hand the test workers the slowest files first.

xdist's own order for ``loadfile`` is by number of tests, most first. A file of one test that
takes 80 s (a coverage row that plans for a minute) was handed out among the last, while the
other worker, done, sat idle: on the two-core CI machine the run took 1047 s where its files
summed to 2 x 999 s. Handing out the longest files first (the classic longest-processing-time
order) leaves the short ones to fill in at the end. The order changes which worker runs a file
and when, nothing else: every file still runs whole on one worker.

The seconds come from ``file_seconds.json``, each file's summed time in a CI run (the lines
``file_progress.py`` prints). A file it does not list (new since) goes first: it may be slow,
and started early it cannot hold up the end. Refresh it from a CI log with
``python tests/file_schedule.py LOG``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).resolve().parent / "file_seconds.json"
_LINE = re.compile(r"(tests/\S+\.py): .* in ([0-9.]+) s$")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def file_seconds() -> dict[str, float]:
    try:
        return json.loads(SECONDS_FILE.read_text())
    except (OSError, ValueError):  # no table: xdist's own order
        return {}


class SlowestFilesFirst:
    """Plugin (registered by ``conftest.py`` on the xdist controller): ``loadfile`` with the
    files handed out slowest first."""

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getoption("dist", None) != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        seconds = file_seconds()
        if not seconds:
            return None

        class Scheduler(LoadFileScheduling):
            def schedule(self) -> None:
                if self.collection is None and self.collection_is_completed:
                    # The work queue is made in collection order when not reordered by size:
                    # order each worker's (identical) collection by its files' seconds.
                    self.config.option.loadscopereorder = False
                    for node, collection in self.registered_collections.items():
                        self.registered_collections[node] = _slowest_files_first(collection, seconds)
                super().schedule()

        return Scheduler(config, log)


def _slowest_files_first(nodeids: list[str], seconds: dict[str, float]) -> list[str]:
    """``nodeids`` grouped by file, files unknown to ``seconds`` first, then slowest first;
    a file's tests keep their order."""
    first_seen: dict[str, int] = {}
    for nodeid in nodeids:
        first_seen.setdefault(_file_of(nodeid), len(first_seen))

    def key(nodeid: str):
        path = _file_of(nodeid)
        return (path in seconds, -seconds.get(path, 0.0), first_seen[path])

    return sorted(nodeids, key=key)


def seconds_from_log(text: str) -> dict[str, float]:
    """Each file's seconds from a run's ``file_progress.py`` lines."""
    found = {}
    for line in text.splitlines():
        match = _LINE.search(line.strip())
        if match:
            found[match[1]] = float(match[2])
    return found


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/file_schedule.py CI_LOG  (rewrites tests/file_seconds.json)")
    table = seconds_from_log(Path(sys.argv[1]).read_text())
    if not table:
        sys.exit(f"{sys.argv[1]}: no 'tests/....py: N passed in S s' lines")
    SECONDS_FILE.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    print(f"{SECONDS_FILE}: {len(table)} files")
