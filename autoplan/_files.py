"""How autoplan writes files: all of a command's outputs or none, each atomically.

A write stages each file as a temp file beside its target (``os.replace`` is atomic only
within one filesystem), and renames the temps over the targets only once every one of
them is written and synced: a full disk, a read-only directory or a bad path fails the
whole command before any target changes. Temp files are named
``.<target>.<host>-<pid>.<random>.tmp``; a process killed mid-write (``kill -9``) cannot
remove its own, so every write first removes the temps of its target left by processes of
this host that are no longer alive (a live writer's temp is never touched).

``check_outputs`` runs before a command does any work: no output may be one of its inputs
or another output, and each must be a file path in a directory that can be written.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import time
from pathlib import Path

from autoplan.errors import OptionError

LEGACY_TEMP_AGE_S = 3600
"""Temps without a writer's pid (written before pids were recorded) are removed once this old."""


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    write_all_atomic({path: text})


def write_all_atomic(files: dict) -> None:
    """Write every ``path -> text`` of ``files``, or, if any cannot be written, none of them.

    Raises the first ``OSError``; then no target has changed and no temp file is left.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            staged.append((_stage(Path(path), text), Path(path)))
        for temp, path in staged:
            os.replace(temp, path)
    except BaseException:
        for temp, _ in staged:
            Path(temp).unlink(missing_ok=True)
        raise


def write_outputs(texts: dict, outputs: dict) -> None:
    """``write_all_atomic`` for a command: an OSError becomes one OptionError naming the
    output (``outputs`` maps each flag to its path)."""
    try:
        write_all_atomic(texts)
    except OSError as err:
        where = next((f"{flag} {path}" for flag, path in outputs.items() if err.filename and
                      os.path.dirname(os.path.abspath(err.filename)) == os.path.dirname(os.path.abspath(path))), None)
        where = where or " and ".join(f"{flag} {path}" for flag, path in outputs.items())
        raise OptionError(
            f"could not write {where}: {err.strerror or err}; no file was changed",
            "pass writable paths (and check the disk has space)",
        ) from err


def check_outputs(outputs: dict[str, str | os.PathLike], inputs: dict[str, str | os.PathLike | None]) -> None:
    """Refuse, before any work, outputs that would overwrite an input or each other, or
    that cannot be written. Keys are how the user named each path (``--out``, "the model file")."""
    seen: dict[str, str] = {}
    for label, path in outputs.items():
        for input_label, input_path in inputs.items():
            if input_path is not None and _same_file(path, input_path):
                raise OptionError(
                    f"{label} {path} is {input_label}: writing it would destroy an input",
                    f"pass another {label} path",
                )
        key = os.path.realpath(path)
        if key in seen:
            raise OptionError(f"{seen[key]} and {label} are the same file {path}", f"pass a different {label} path")
        seen[key] = label
        _check_writable(label, Path(path))


def plan_default_path(model_name: str, mesh: tuple[int, ...]) -> Path:
    """Where ``suggest`` writes a plan when no --out is given."""
    return Path("plans_out") / f"{model_name}-{'x'.join(map(str, mesh))}.json"


def _stage(path: Path, text: str) -> str:
    """``text`` in a synced temp file beside ``path``; returns the temp's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_HOST}-{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        os.chmod(temp, 0o666 & ~_current_umask())
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return temp


def remove_stale_temps(path: Path) -> None:
    """Remove temps of ``path`` whose writer (a process of this host) is gone."""
    try:
        candidates = list(path.parent.glob(f".{_glob_escape(path.name)}.*.tmp"))
    except OSError:
        return
    for temp in candidates:
        writer = temp.name[len(path.name) + 2:].split(".", 1)[0]
        host, _, pid = writer.rpartition("-")
        if host == _HOST and pid.isdigit():
            stale = not _alive(int(pid))
        elif host:  # another host's writer, on a shared filesystem: not ours to judge
            stale = False
        else:
            stale = _older_than(temp, LEGACY_TEMP_AGE_S)
        if stale:
            temp.unlink(missing_ok=True)


def _check_writable(label: str, path: Path) -> None:
    if path.is_dir():
        raise OptionError(f"{label} {path} is a directory", f"pass a file path for {label}")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OptionError(f"cannot write {label} {path}: {existing} is not a directory", f"pass a writable {label} path")
    try:  # os.access says yes to root on read-only mounts and /proc: try it
        fd, probe = tempfile.mkstemp(dir=existing, prefix=f".{path.name}.{_HOST}-{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OptionError(
            f"cannot write {label} {path}: a file cannot be created in {existing} ({err.strerror or err})",
            f"pass a writable {label} path",
        ) from None


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)  # hard links and symlinks too
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


# Short and free of "-" and ".", so that a temp's name splits back into host and pid.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _current_umask() -> int:
    # The only way to read the umask is to set it and put it back.
    umask = os.umask(0o022)
    os.umask(umask)
    return umask
