"""How a training step calls the model: inference-only caches switched off.

HuggingFace configs ship with ``use_cache=True``, and their forward builds a key/value cache
even in training mode: one more copy of every layer's keys and values, kept alive with the
output and never read by the loss. It also cannot be planned: the cache starts as a
legacy empty 1-D tensor that ``torch.cat`` skips, which DTensor's ``cat`` rule rejects.
The trace (``trace/tracer.py``) and the applied model (``apply/engine.py``) therefore call a model
whose forward takes a ``use_cache`` argument with ``use_cache=False`` while it is in
training mode, unless the batch sets it. So too a model whose forward only passes
``**kwargs`` on to its inner model but whose config has ``use_cache`` (GraniteMoE's causal
LM, in transformers 5: its inner model reads the flag from the config when not given), or
a config it nests has it (a speech-to-text model's ``text_config``: MOSS-Transcribe's
language model built a cache whose empty start DTensor's ``cat`` cannot split).
The loss and gradients are the same; a model in ``eval()`` mode (generation) keeps its cache.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

CACHE_ARGUMENT = "use_cache"


def training_kwargs(model: nn.Module, kwargs: dict) -> dict:
    """``kwargs`` for a training-mode call of ``model``, with the inference cache off."""
    if not model.training or CACHE_ARGUMENT in kwargs:
        return kwargs
    forward = getattr(model.forward, "__func__", model.forward)
    names, passes_on = _arguments(forward)
    if CACHE_ARGUMENT in names or (passes_on and _has_cache_flag(getattr(model, "config", None))):
        return {**kwargs, CACHE_ARGUMENT: False}
    return kwargs


def _has_cache_flag(config) -> bool:
    """Whether a model's config, or a config it nests (a multimodal model's ``text_config``,
    whose language model reads the flag there), sets ``use_cache``."""
    if config is None:
        return False
    if getattr(config, CACHE_ARGUMENT, None) is not None:
        return True
    nested = getattr(config, "__dict__", {}).values()
    return any(getattr(value, CACHE_ARGUMENT, None) is not None for value in nested if value is not config)


@functools.lru_cache(maxsize=256)
def _arguments(forward) -> tuple[frozenset, bool]:
    """(the names ``forward`` declares as keyword arguments, whether it takes ``**kwargs``);
    read once per forward function: the applied model asks on every step."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # a forward with no inspectable signature
        return frozenset(), False
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in named), any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )
