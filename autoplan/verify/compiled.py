"""Compile a planned model the two ways people do: per transformer block, or whole.

``compile_model(model, "block")`` replaces each repeated block (every child of an
``nn.ModuleList`` whose children are all of one class, as ``model.layers`` of a
transformer) with its ``torch.compile``d self in place, the way torchtitan compiles;
``"whole"`` returns ``torch.compile(model)``. Parameter FQNs of compiled blocks gain
``._orig_mod`` (torch's wrapper); the parameters themselves are the model's.
"""

from __future__ import annotations

import torch
from torch import nn

from autoplan.errors import PlanError

MODES = ("block", "whole")


def compile_model(model: nn.Module, mode: str, backend: str = "inductor"):
    """The callable that runs ``model`` compiled per ``mode`` (``model`` itself for "block")."""
    if mode == "whole":
        return torch.compile(model, backend=backend)
    if mode != "block":
        raise PlanError(f"expected a compile mode in {MODES}, got {mode!r}", hint="pass --compile block or --compile whole")
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and _repeated(m)]
    if not lists:
        raise PlanError("the model has no repeated blocks to compile (no nn.ModuleList of one module class)", hint="use --compile whole")
    for blocks in lists:
        for index, block in enumerate(blocks):
            # torch.compile of a module returns a module (OptimizedModule); torch types it as a callable
            blocks[index] = torch.compile(block, backend=backend)  # type: ignore[assignment]
    return model


def _repeated(blocks: nn.ModuleList) -> bool:
    kinds = {type(block) for block in blocks}
    return len(blocks) > 0 and len(kinds) == 1 and any(True for _ in blocks[0].parameters())
