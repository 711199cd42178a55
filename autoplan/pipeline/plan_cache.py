"""A content-keyed cache of plans in ``plans_out/cache/``: same question, same plan, no solve.

The key is the SHA-256 of everything the answer depends on, written as canonical JSON:

- the model: the traced graph's fingerprint (graph, parameter and buffer shapes and
  dtypes; for a stack of identical layers planned once, the two traced layers and the
  stack's layer count and class), which parameters are trainable, the module names and classes, the batch's key
  paths (the plan is keyed by all of them);
- the mesh shape and axis names, the cluster profile's whole content (not its name: a
  re-calibrated profile of the same name is another profile), the memory budget in bytes,
  the solver time limit and any pinned placements;
- the planner itself: a hash of autoplan's source files and the torch and OR-Tools
  versions, so that a changed planner never serves a plan it would no longer make.

An entry is one JSON file ``<key>.json`` holding the key, the fields it was made from,
the plan and what the planning run reported. It is written atomically. An entry is
validated like any plan file (``Plan.from_dict``); an invalid one, or one whose key or plan
does not match, is removed with a one-line warning and the plan is solved again.

The cache is best-effort: a directory that cannot be read or written (read-only, full,
not a directory) costs one warning (``CacheWarning``), never the plan. Concurrent runs of
the same question do not wait for each other: each solves (the same plan, byte for byte)
and the last atomic store wins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from autoplan._files import write_atomic
from autoplan.errors import AutoplanError
from autoplan.plan.module_plan import Plan

CACHE_FORMAT = 1
DEFAULT_CACHE_DIR = Path("plans_out") / "cache"
CACHE_DIR_ENV = "AUTOPLAN_CACHE_DIR"
"""Environment variable that moves the default cache directory (tests point it at a temp dir)."""
_SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the autoplan package


def default_cache_dir() -> Path:
    """``$AUTOPLAN_CACHE_DIR`` when set, else ``plans_out/cache`` under the working directory."""
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR)


@dataclass(frozen=True, slots=True)
class CacheKey:
    digest: str
    """Hex SHA-256 of ``fields`` as canonical JSON; the entry's file name."""
    fields: dict
    """What the plan depends on, as plain JSON data."""


@dataclass(frozen=True, slots=True)
class CachedPlan:
    plan: Plan
    path: Path
    report: dict
    """What the planning run that made the plan reported (stage seconds, graph sizes)."""


def make_cache_key(trace, mesh, axis_names, profile, budget_bytes: float, time_limit_s, pinned, recompute: bool = True,
                   regime: str = "none", expert_parallel: bool = False) -> CacheKey:
    """The key of one planning question; ``trace`` is ``problem.trace_for_planning``'s result
    (with tied layers its fingerprint names the stack: layer count and class)."""
    traced = trace.traced
    fields = {
        "cache_format": CACHE_FORMAT,
        "model": {
            "fingerprint": trace.fingerprint,
            "trainable": sorted(traced.trainable),
            "modules": dict(sorted(traced.module_types.items())),
            "batch": sorted(traced.inputs.values()),
            "batch_is_kwargs": traced.batch_is_kwargs,
        },
        "mesh": {"shape": [int(n) for n in mesh], "axis_names": list(axis_names)},
        "profile": _jsonable(dataclasses.asdict(profile)),
        "budget_bytes": float(budget_bytes),
        "time_limit_s": None if time_limit_s is None else float(time_limit_s),
        "pinned": {name: list(spec) for name, spec in sorted((pinned or {}).items())},
        "recompute": bool(recompute),
        "regime": regime,
        "planner": {"source": _planner_source_hash(), "torch": torch.__version__, "ortools": _ortools_version()},
    }
    if expert_parallel:  # absent otherwise: keys of questions without it are unchanged
        fields["expert_parallel"] = True
    return CacheKey(hashlib.sha256(_canonical(fields).encode()).hexdigest(), fields)


class PlanCache:
    """Plans on disk, one file per key, in ``directory``."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def path(self, key: CacheKey) -> Path:
        return self.directory / f"{key.digest}.json"

    def lookup(self, key: CacheKey) -> CachedPlan | None:
        """The cached plan for ``key``, or None: missing, unreadable (warned), or invalid
        (warned and removed, so that the plan is solved again and stored afresh)."""
        path = self.path(key)
        try:
            if not path.is_file():
                return None
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            _warn(f"could not read plan cache entry {path} ({_reason(err)}); planning without it")
            return None
        try:
            entry = json.loads(text)
            problem = _mismatch(entry, key)
            if problem is None:
                plan = Plan.from_dict(entry["plan"], source=str(path))
                problem = _plan_mismatch(plan, key)
        except (ValueError, RecursionError, AutoplanError) as err:  # JSONDecodeError is a ValueError
            reason = err.problem.removeprefix(f"plan {path}: ") if isinstance(err, AutoplanError) else str(err)
            problem = f"it is not a valid entry ({reason})"
        if problem is not None:
            _warn(f"removed plan cache entry {path}: {problem}; planning again")
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return CachedPlan(plan, path, dict(entry.get("report") or {}))

    def store(self, key: CacheKey, plan: Plan, report: dict) -> Path | None:
        """Write (or replace) the entry for ``key`` atomically; returns its path, or None
        (warned) where the cache cannot be written: the cache is an optimisation, never
        worth the plan."""
        entry = {"cache_format": CACHE_FORMAT, "key": key.digest, "fields": key.fields, "plan": plan.to_dict(), "report": report}
        path = self.path(key)
        try:
            write_atomic(path, json.dumps(entry, indent=1, sort_keys=True) + "\n")
        except OSError as err:
            reason = "it is not a directory" if self.directory.exists() and not self.directory.is_dir() else _reason(err)
            _warn(f"could not store the plan in the plan cache {self.directory} ({reason}); the plan is not cached")
            return None
        return path


def _warn(message: str) -> None:
    warnings.warn(f"autoplan: {message}", CacheWarning, stacklevel=3)


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


class CacheWarning(UserWarning):
    """The plan cache could not be used; planning went on without it."""


def _mismatch(entry, key: CacheKey) -> str | None:
    if not isinstance(entry, dict):
        return f"expected a JSON object, got {type(entry).__name__}"
    if entry.get("cache_format") != CACHE_FORMAT:
        return f"cache_format {entry.get('cache_format')!r}, expected {CACHE_FORMAT}"
    if entry.get("key") != key.digest or _canonical(entry.get("fields")) != _canonical(key.fields):
        return "its key does not match its file name or the question asked"
    if not isinstance(entry.get("plan"), dict):
        return "it holds no plan"
    return None


def _plan_mismatch(plan: Plan, key: CacheKey) -> str | None:
    fields = key.fields
    if plan.fingerprint != fields["model"]["fingerprint"]:
        return f"its plan is for model {plan.fingerprint}, expected {fields['model']['fingerprint']}"
    if list(plan.mesh_shape) != fields["mesh"]["shape"] or list(plan.axis_names) != fields["mesh"]["axis_names"]:
        return f"its plan is for mesh {list(plan.mesh_shape)} {list(plan.axis_names)}, expected {fields['mesh']}"
    return None


def _canonical(fields) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def _jsonable(value):
    """Plain JSON data from a profile's ``asdict`` (tuple keys such as mesh shapes become strings)."""
    if isinstance(value, dict):
        return {("x".join(map(str, k)) if isinstance(k, tuple) else str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) or value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)


_source_hash: str | None = None


def _planner_source_hash() -> str:
    global _source_hash
    if _source_hash is None:
        digest = hashlib.sha256()
        for path in sorted(_SOURCE_ROOT.rglob("*.py")):
            digest.update(path.relative_to(_SOURCE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        _source_hash = digest.hexdigest()
    return _source_hash


def _ortools_version() -> str:
    try:
        from importlib.metadata import version

        return version("ortools")
    except Exception:  # noqa: BLE001 - not installed as a distribution: the source hash still guards the planner
        return "unknown"
