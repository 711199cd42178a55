"""How a training step calls the model: inference-only caches switched off.

HuggingFace configs ship with ``use_cache=True``, and their forward builds a key/value cache
even in training mode: one more copy of every layer's keys and values, kept alive with the
output and never read by the loss. It also cannot be planned: the cache starts as a
legacy empty 1-D tensor that ``torch.cat`` skips, which DTensor's ``cat`` rule rejects.
The trace (``trace/tracer.py``) and the applied model (``apply/engine.py``) therefore call a model
whose forward takes a ``use_cache`` argument with ``use_cache=False`` while it is in
training mode, unless the batch sets it. So too a model whose forward only passes
``**kwargs`` on to its inner model but whose config has ``use_cache`` (GraniteMoE's causal
LM, in transformers 5: its inner model reads the flag from the config when not given). The loss and gradients are the same; a model in
``eval()`` mode (generation) keeps its cache.
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
    passed_on = _takes_any_keyword(model) and getattr(getattr(model, "config", None), CACHE_ARGUMENT, None) is not None
    if not (_names_argument(model, CACHE_ARGUMENT) or passed_on):
        return kwargs
    return {**kwargs, CACHE_ARGUMENT: False}


def _names_argument(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` declares ``name`` (not merely accepts ``**kwargs``)."""
    forward = model.forward
    # The applied model asks on every step: read each forward function's signature once.
    return _declares(getattr(forward, "__func__", forward), name)


def _takes_any_keyword(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``**kwargs``."""
    forward = model.forward
    return _has_var_keyword(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=256)
def _has_var_keyword(forward) -> bool:
    try:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return False


@functools.lru_cache(maxsize=256)
def _declares(forward, name: str) -> bool:
    try:
        parameter = inspect.signature(forward).parameters.get(name)
    except (TypeError, ValueError):  # a forward with no inspectable signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY,
    )
