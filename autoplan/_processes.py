"""Child processes that die with the process that started them.

calibrate's ranks and verify's gloo ranks are separate interpreters. If their launcher is
killed outright (``kill -9``, the OOM killer), nothing in it runs to stop them, and a
calibration rank would go on measuring and then write its profile minutes after the user
saw the command die. So each child asks the kernel to kill it when its parent dies
(Linux ``PR_SET_PDEATHSIG``), and a writing child checks its parent is still there right
before it writes (``parent_alive``). Elsewhere a watchdog thread polls the parent instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_expected_parent: int | None = None


def die_with_parent(parent_pid: int) -> None:
    """Kill this process (SIGKILL) when ``parent_pid``, its launcher, exits; exit now if it
    already has (it may die before this runs)."""
    global _expected_parent
    _expected_parent = parent_pid
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, name="autoplan-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def parent_alive() -> bool:
    """False once the launcher named to ``die_with_parent`` is gone (True if none was named)."""
    return _expected_parent is None or os.getppid() == _expected_parent


def _set_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent() -> None:
    while parent_alive():
        time.sleep(0.5)
    os._exit(1)
