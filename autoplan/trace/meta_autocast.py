"""Autocast regions on the meta device, while autoplan traces.

Models take the autocast device from their tensors: torchtitan's MoE router runs
``with torch.autocast(device_type=x.device.type, enabled=False):``. autoplan traces on meta
tensors, and torch has no autocast for "meta" ("User specified an unsupported autocast
device_type 'meta'", or "unsupported scalarType" when no dtype is given). Inside ``meta_autocast()``, on the thread that traces and nowhere
else, such a region is entered as a no-op and recorded. That is exact for a region that
switches autocast off (none is on in the trace) and for the ops' dtypes in any case: torch
has no autocast dispatch key for meta tensors, so even an autocast on another device would
leave the traced dtypes as the model's own. A region that asks for autocast is therefore
traced in the model's dtypes, and the tracer's warnings say so.

``torch.autocast`` is a class that user code reaches by many names (``torch.autocast``,
``torch.amp.autocast``, subclasses, a name imported before the trace), so its methods are
replaced while any thread traces, and put back when the last one is done, even after an
error. The replacements hand every call that is not a meta region on the tracing thread
to torch's own methods: other threads and other devices see torch as it is.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch.amp.autocast_mode as autocast_mode

_lock = threading.Lock()
_users = 0
_originals: dict[str, object] = {}
_local = threading.local()
"""``regions``: the enabled flag of each meta region this thread's trace entered, or absent."""


@contextmanager
def meta_autocast():
    """While tracing: ``torch.autocast("meta", ...)`` is a no-op region; yields the list of
    each such region's ``enabled`` flag, in the order they were entered."""
    regions: list[bool] = []
    outer = getattr(_local, "regions", None)
    _local.regions = regions
    _install()
    try:
        yield regions
    finally:
        _uninstall()
        _local.regions = outer


def _install() -> None:
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        cls = autocast_mode.autocast
        _originals.update(__init__=cls.__init__, __enter__=cls.__enter__, __exit__=cls.__exit__)
        for name, patched in (("__init__", _init), ("__enter__", _enter), ("__exit__", _exit)):
            setattr(cls, name, patched)


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            cls = autocast_mode.autocast
            for name in ("__init__", "__enter__", "__exit__"):
                setattr(cls, name, _originals[name])
            _originals.clear()


def _init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
    regions = getattr(_local, "regions", None)
    if device_type != "meta" or regions is None:
        return _originals["__init__"](self, device_type, dtype, enabled, cache_enabled)
    self.device, self.fast_dtype, self._enabled, self._cache_enabled = "meta", dtype, enabled, cache_enabled
    self._autoplan_meta = True
    regions.append(bool(enabled))
    return None


def _enter(self):
    if getattr(self, "_autoplan_meta", False):
        return self
    return _originals["__enter__"](self)


def _exit(self, exc_type, exc_val, exc_tb):
    if getattr(self, "_autoplan_meta", False):
        return False
    return _originals["__exit__"](self, exc_type, exc_val, exc_tb)
