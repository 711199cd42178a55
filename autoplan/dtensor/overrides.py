"""What autoplan changes in DTensor, installed only while autoplan plans or runs a planned model.

Importing autoplan changes nothing in torch. The changes below are put in place by
``install()`` (or ``with installed():``) and taken out again by the matching
``uninstall()``; installs nest (a count), so the planner's stages and a planned model's
forward and backward can each hold them without knowing about the others:

- sharding rules DTensor lacks (``rules.py``), and the replicate fallback for ops a plan
  lists in ``fallback_ops``: added to DTensor's registry, deleted again;
- DTensor's rules for the reshaping views, wrapped (``view_rules.py``);
- DTensor's per-op strategy selection, wrapped (``strategy_choice.py``);
- DTensor's ``redistribute_local_tensor`` as its dispatcher calls it, wrapped so that the
  backward reuses a forward move autograd saved (``saved_inputs.py``);
- fake-tensor kernels for what the device kernels accept (``fake_kernels.py``).

Sharding decisions DTensor caches depend on these rules, so each side keeps its own: the
Python-level propagation cache is swapped for autoplan's own (both stay warm), and the
C++ fast-path cache, which cannot be swapped, is cleared on every change of hands.

Every internal name is looked up at install time; if the running torch has moved one, the
install fails with one line naming it, before anything is changed.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager

import torch

from autoplan.errors import AutoplanError

_lock = threading.RLock()
_depth = 0
_fallback_ops: set = set()
_restore: list = []
"""(container, key, old value or _ABSENT) for each change in force, in the order made."""
_own_cache = None
_ABSENT = object()


class DTensorInternalsError(AutoplanError):
    """The running torch's DTensor lacks an internal autoplan changes while it runs."""


def install() -> None:
    """Put autoplan's DTensor changes in place (nested installs only count)."""
    global _depth
    with _lock:
        if _depth == 0:
            _apply(_changes())
        _depth += 1


def uninstall() -> None:
    """Undo one ``install()``; the last one restores torch exactly."""
    global _depth
    with _lock:
        if _depth == 0:
            raise RuntimeError("autoplan's DTensor changes are not installed")
        _depth -= 1
        if _depth == 0:
            _undo()


@contextmanager
def installed():
    """``install()`` for the duration of the block."""
    install()
    try:
        yield
    finally:
        uninstall()


def is_installed() -> bool:
    return _depth > 0


def add_fallback(op) -> None:
    """Let DTensor run ``op`` (and its backward op, if it lacks a rule) replicated while the
    changes are installed (a plan lists such ops in ``fallback_ops``)."""
    with _lock:
        if op in _fallback_ops:
            return
        _fallback_ops.add(op)
        if _depth:  # already in force: re-install with the op included
            _undo()
            _apply(_changes())


def _changes() -> list[tuple[object, object, object]]:
    """(container, key, new value) for every change, every internal looked up first."""
    from autoplan.dtensor import fake_kernels, rules, saved_inputs, strategy_choice, view_rules

    propagator = _internal(lambda: torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator, "DTensor._op_dispatcher.sharding_propagator")
    sharding_prop = _internal(lambda: __import__("torch.distributed.tensor._sharding_prop", fromlist=["_"]), "torch.distributed.tensor._sharding_prop")
    dispatch = _internal(lambda: __import__("torch.distributed.tensor._dispatch", fromlist=["_"]), "torch.distributed.tensor._dispatch")
    fake_impls = _internal(lambda: __import__("torch._subclasses.fake_impls", fromlist=["_"]).op_implementations_dict, "fake_impls.op_implementations_dict")
    for owner, name in (
        (sharding_prop, "_select_min_cost_strategy"), (dispatch, "redistribute_local_tensor"),
        (propagator, "op_strategy_funcs"), (propagator, "op_single_dim_strategy_funcs"),
        (propagator, "op_to_schema_info"), (propagator, "propagate_op_sharding"),
        (propagator, "propagate_op_sharding_non_cached"), (torch._C, "_clear_DTensor_sharding_propagator_cache"),
    ):
        _internal(lambda: getattr(owner, name), f"{getattr(owner, '__name__', type(owner).__name__)}.{name}")

    def has_rule(op) -> bool:
        return op in propagator.op_strategy_funcs or op in propagator.op_single_dim_strategy_funcs

    changes = []
    added = {}
    for op, strategy, schema_info in [*rules.builtin_rules(), *rules.fallback_rules(_fallback_ops, has_rule)]:
        if op not in added and not has_rule(op):  # never replace a rule torch has
            added[op] = (strategy, schema_info)
    for op, (strategy, schema_info) in added.items():
        changes.append((propagator.op_strategy_funcs, op, strategy))
        changes.append((propagator.op_to_schema_info, op, schema_info))
    for op in view_rules.RESHAPING_VIEWS:
        rule = propagator.op_strategy_funcs.get(op)
        if rule is not None:
            changes.append((propagator.op_strategy_funcs, op, view_rules.unstrided(rule)))
    changes.append((sharding_prop, "_select_min_cost_strategy", strategy_choice.selection(sharding_prop._select_min_cost_strategy)))
    changes.append((dispatch, "redistribute_local_tensor", saved_inputs.reusing(dispatch.redistribute_local_tensor)))
    for op, kernel in fake_kernels.KERNELS.items():
        if op not in fake_impls:  # never replace a kernel torch registered
            changes.append((fake_impls, op, kernel))
    changes.append((propagator, "propagate_op_sharding", _autoplan_cache(propagator)))
    return changes


def _internal(lookup, name: str):
    try:
        return lookup()
    except (AttributeError, ImportError) as err:
        raise DTensorInternalsError(
            f"this torch ({torch.__version__}) has no {name}, which autoplan changes while it plans and runs plans",
            hint="use a torch version autoplan supports (see the README's requirements)",
        ) from err


def _autoplan_cache(propagator):
    """autoplan's own propagation cache (made once: it stays warm between installs)."""
    global _own_cache
    if _own_cache is None:
        _own_cache = type(propagator.propagate_op_sharding)(propagator.propagate_op_sharding_non_cached)
    return _own_cache


def _apply(changes) -> None:
    for container, key, value in changes:
        _restore.append((container, key, _get(container, key)))
        _set(container, key, value)
    torch._C._clear_DTensor_sharding_propagator_cache()


def _undo() -> None:
    while _restore:
        container, key, old = _restore.pop()
        _set(container, key, old)
    torch._C._clear_DTensor_sharding_propagator_cache()


def _get(container, key):
    if isinstance(container, dict):
        return container.get(key, _ABSENT)
    return getattr(container, key)


def _set(container, key, value) -> None:
    if isinstance(container, dict):
        if value is _ABSENT:
            container.pop(key, None)
        else:
            container[key] = value
    else:
        setattr(container, key, value)


def while_installed(function):
    """``function`` run with the changes installed (a stage entry point that needs them)."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        with installed():
            return function(*args, **kwargs)

    return run
