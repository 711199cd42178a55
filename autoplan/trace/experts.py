"""Which modules are experts: the general rule, read from a module's parameters and call.

An *experts module* holds, directly, parameters that all share one leading size ``E >= 2``
with at least one 3-D (a matrix per expert; the others a bias per expert, as gpt-oss's),
has no child module with parameters, and its ``forward`` takes the tokens in one of the
two forms mixture-of-experts code calls its experts with (its positional parameters,
defaults or not):

- **routed** (three tensors: tokens ``(T, H)``, top-k expert index ``(T, k)``, top-k
  weights ``(T, k)``), as HuggingFace transformers' experts modules take them
  (``@use_experts_implementation``); their output is ``sum_k w_k * expert_k(token)``;
- **grouped** (two tensors: tokens already sorted by expert ``(N, H)``, tokens per expert
  ``(E,)``), as torchtitan's grouped experts take them; the module that calls them (their
  parent) sorts, weights and sums, and holds no parameters of its own.

The tracer reads it (routed experts traced as one region whose layout the solver
chooses, ``choices/expert_layouts.py``), and so do the plan and the apply engine.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

ROUTED, GROUPED = "routed", "grouped"
"""How an experts module takes its tokens (see the module docstring)."""


@dataclass(frozen=True)
class ExpertsModule:
    fqn: str
    experts: int
    """E: the leading size of every parameter."""
    call: str
    """ROUTED or GROUPED."""


def experts_call(module: nn.Module) -> str | None:
    """ROUTED, GROUPED, or None: how ``module``'s forward takes tokens, by its signature."""
    try:
        signature = inspect.signature(module.forward)  # follows functools.wraps (transformers' decorator)
    except (TypeError, ValueError):
        return None
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_rest = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values())
    if has_rest:
        return None
    return {3: ROUTED, 2: GROUPED}.get(len(positional))


def find_experts(model: nn.Module) -> list[ExpertsModule]:
    """Every experts module of ``model`` (see the module docstring), in module order."""
    found = []
    for fqn, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if not params or any(True for child in module.children() for _ in child.parameters()):
            continue
        leading = {p.shape[0] if p.dim() else 0 for p in params}
        if len(leading) != 1 or not any(p.dim() == 3 for p in params) or next(iter(leading)) < 2:
            continue
        call = experts_call(module)
        if call is not None:
            found.append(ExpertsModule(fqn, int(next(iter(leading))), call))
    return found
