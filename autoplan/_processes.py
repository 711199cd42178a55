"""Child processes that die with the process that started them.

calibrate's ranks and verify's gloo ranks are separate interpreters. If their launcher is
killed outright (``kill -9``, the OOM killer), nothing in it runs to stop them, and a
calibration rank would go on measuring and then write its profile minutes after the user
saw the command die. So each child asks the kernel to kill it when its parent dies
(Linux ``PR_SET_PDEATHSIG``), and a writing child checks its parent is still there right
before it writes (``parent_alive``). Elsewhere a watchdog thread polls the parent instead.

verify's ranks are forked by a fork server (``start_ranks``), a child of the launcher that
exits when the launcher does: the rank dies with the server, and so with the launcher.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_expected_parent: int | None = None


def die_with_parent(parent_pid: int) -> None:
    """Kill this process (SIGKILL) when ``parent_pid``, its launcher, exits; exit now if it
    already has (it may die before this runs)."""
    global _expected_parent
    parent = os.getppid()
    if parent != parent_pid and _parent_of(parent) == parent_pid:
        parent_pid = parent  # the launcher's fork server (``start_ranks``)
        _let_the_fork_server_exit_with_the_launcher()
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


def _let_the_fork_server_exit_with_the_launcher() -> None:
    """The fork server exits once no process holds the write end of its "alive" pipe. Its
    clients are the launcher and every process it forked, which inherit that end so that
    they may ask it for processes in turn; a rank never does, and while it holds the end,
    the server (and so the rank) would outlive a launcher killed outright."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # CPython's private object, not in typeshed
    if getattr(server, "_forkserver_alive_fd", None) is not None:  # CPython's name for it (3.10 to 3.13)
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid`` (Linux's /proc), or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (name) state"
    except (OSError, ValueError, IndexError):
        return None


_PRELOAD = ["torch", "torch.distributed.tensor", "autoplan", "autoplan.verify.numerics", "autoplan.apply.engine"]
"""What the fork server imports once for every rank it forks (a rank's step applies a plan)."""
_server_preload: tuple[str, ...] | None = None
"""What the fork server this process started was told to import; None before it started one."""


def start_ranks(rank_main, args: tuple, nprocs: int, preload: tuple[str, ...] = ()) -> None:
    """``torch.multiprocessing.spawn(rank_main, args, nprocs)`` with the ranks forked by a fork
    server that has imported torch and autoplan already: a spawned rank imports them
    itself, seconds of CPU each, which eight ranks pay on every launch while they share a
    few cores. ``preload``: further modules the ranks import (a model file's library,
    ``model_file_modules``); a server started without one of their packages is started
    again with them, the few modules it lacks of a package it has are left to the ranks.
    ``rank_main`` must be importable by name, as for spawn; a rank reads its environment
    from the server (started with the first launch), so it sets what it needs itself (its
    thread count)."""
    import multiprocessing
    from multiprocessing import forkserver

    import torch.multiprocessing as mp

    global _server_preload
    wanted = tuple(dict.fromkeys([*_PRELOAD, *(_server_preload or ()), *preload]))
    if _server_preload is not None and not {_root(m) for m in wanted} <= {_root(m) for m in _server_preload}:
        stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's, private (3.8 on): the next launch starts it again
        if stop is not None:
            stop()
    if _server_preload is None or wanted != _server_preload:
        multiprocessing.get_context("forkserver").set_forkserver_preload(list(wanted))  # read when the server starts
        _server_preload = wanted
    mp.start_processes(rank_main, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def _root(module: str) -> str:
    return module.split(".", 1)[0]


def model_file_modules(path: str | Path) -> tuple[str, ...]:
    """What a rank importing the model file at ``path`` would import that is worth importing
    once in the fork server: the modules its ``import`` statements name (read from its
    source) that this process has loaded, and the modules that define the names it imports
    from them (a model class a library loads lazily, with that library's heavy base).
    torch and autoplan are preloaded anyway; what is not loaded here is left to the ranks."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    found: list[str] = []
    named: list[tuple[str, str | None]]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, attribute in named:
            loaded = sys.modules.get(module)
            if _root(module) in ("torch", "autoplan", "__future__") or loaded is None:
                continue
            found.append(module)
            try:  # a lazily loaded name is loaded here already: the model file ran in this process
                owner = getattr(getattr(loaded, attribute), "__module__", None) if attribute else None
            except Exception:  # noqa: BLE001 - a library's own attribute hook: leave the name to the ranks
                owner = None
            if isinstance(owner, str) and owner in sys.modules and _root(owner) == _root(module):
                found.append(owner)
    return tuple(dict.fromkeys(found))
