"""Small file helpers shared by the CLI commands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    The temp file lives in the target's directory because ``os.replace`` is atomic only
    within one filesystem. On any failure the temp file is removed and the target untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        os.chmod(temp, 0o666 & ~_current_umask())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def plan_default_path(model_name: str, mesh: tuple[int, ...]) -> Path:
    """Where ``suggest`` writes a plan when no --out is given."""
    return Path("plans_out") / f"{model_name}-{'x'.join(map(str, mesh))}.json"


def _current_umask() -> int:
    # The only way to read the umask is to set it and put it back.
    umask = os.umask(0o022)
    os.umask(umask)
    return umask
