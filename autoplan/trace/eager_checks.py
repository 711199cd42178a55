"""Checks a model runs only eagerly, traced as the eager step runs them.

transformers' ``PreTrainedModel.warn_if_padding_and_no_attention_mask`` looks, when a
model is called without an attention mask, for the pad token in each row's first and last
token (``pad_token_id in input_ids[:, [-1, 0]]``: a comparison, an ``any``, and a read of
its value) and warns once. It returns at once while tracing (``is_tracing(input_ids)``), so a
trace never saw it, but the training step runs it on the batch as the plan lays it out, and
DTensor moves what ``any`` needs: torch 2.14 runs ``any`` only on an input whole on every
axis (it is not a linear reduction), so a batch split by rows is gathered first (input ids
split on tp: a few bytes on every step that the prediction lacked). 2.13 ran it as a
partial sum whose local value was read, moving nothing.

``eager_checks()``, entered with ``known_values()`` (the trace, and ``verify`` on fake
tensors), has the check run its tensor ops on the tracing thread, without reading the value
(which decides a warning only); other threads, and the model outside it, are untouched.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Any

_local = threading.local()
_lock = threading.Lock()
_users = 0
_original = None
_NAME = "warn_if_padding_and_no_attention_mask"


@contextmanager
def eager_checks():
    outer = getattr(_local, "on", False)
    _local.on = True
    _patch()
    try:
        yield
    finally:
        _unpatch()
        _local.on = outer


def _traced_padding_check(self, input_ids, attention_mask):
    if not getattr(_local, "on", False):
        assert _original is not None  # installed before this replaces it
        return _original(self, input_ids, attention_mask)
    pad = getattr(getattr(self, "config", None), "pad_token_id", None)
    if attention_mask is not None or pad is None or input_ids is None or input_ids.dim() < 2:
        return None
    # The tensor ops of ``pad in input_ids[:, [-1, 0]]``; its value decides a warning only.
    (input_ids[:, [-1, 0]] == pad).any()
    return None


def _patch() -> None:
    global _users, _original
    with _lock:
        _users += 1
        module: Any = sys.modules.get("transformers.modeling_utils")
        owner = getattr(module, "PreTrainedModel", None)
        if _users == 1 and owner is not None and _NAME in vars(owner):
            _original = vars(owner)[_NAME]
            setattr(owner, _NAME, _traced_padding_check)


def _unpatch() -> None:
    global _users, _original
    with _lock:
        _users -= 1
        module: Any = sys.modules.get("transformers.modeling_utils")
        owner = getattr(module, "PreTrainedModel", None)
        if _users == 0 and _original is not None:
            if owner is not None:
                setattr(owner, _NAME, _original)
            _original = None
