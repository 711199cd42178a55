"""Repeated blocks: find a model's stack of identical layers and trace only two of them.

A transformer is an embedding, N identical layers and a head. Tracing, enumerating and
costing all N layers repeats the same work N times (tracing the 32-layer 7B takes 11 s,
enumerating its strategies naively 300 s), and the ILP grows with N. So ``suggest``
traces the model with its layer list cut to its first two layers and lets ``solve/tie.py``
stand the second traced layer in for layers 1..N-1.

Why two layers and not one: the edge from one layer's output to the next layer's input
(the residual stream crossing a layer boundary) only appears in the graph when two
layers are traced. With the two tied to one set of decisions, layer 1's node costs and
in-edges, multiplied by N-1, are exactly the costs of layers 1..N-1 in the full model
(each reads its predecessor and the values computed before the stack, as layer 1 does).

A stack qualifies when it is an ``nn.ModuleList`` of at least three modules (no ``None``
entries) of one class with the same parameter and buffer names, shapes, dtypes and ``requires_grad``; the one
with the most parameters wins. Whether the two traced layers really produced the same
graph is checked later (``tie.match_blocks``); if not, the caller traces the whole model.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass

from torch import nn

KEPT_LAYERS = 2
MIN_LAYERS = 3  # with two layers, cutting saves nothing


@dataclass(frozen=True, slots=True)
class RepeatedBlocks:
    """A stack of identical layers in the model."""

    fqn: str
    """FQN of the ``nn.ModuleList`` holding the layers (e.g. ``model.layers``)."""
    count: int
    """Number of layers in the full model."""
    layer_class: str
    """Class name of the layers."""

    def layer_prefix(self, index: int) -> str:
        return f"{self.fqn}.{index}" if self.fqn else str(index)

    def layer_of(self, fqn: str) -> int | None:
        """Index of the layer that module or parameter ``fqn`` belongs to, else None."""
        head = f"{self.fqn}." if self.fqn else ""
        if not fqn.startswith(head):
            return None
        index = fqn[len(head):].split(".", 1)[0]
        return int(index) if index.isdigit() else None

    def rename(self, fqn: str, index: int) -> str:
        """``fqn`` (inside some layer) moved to layer ``index``."""
        head = f"{self.fqn}." if self.fqn else ""
        rest = fqn[len(head):].split(".", 1)
        return head + str(index) + ("." + rest[1] if len(rest) > 1 else "")

    def widen(self, table: dict, names_modules: bool = False) -> dict:
        """``table`` (FQN -> value) of the cut model, with the last traced layer's entries
        copied to every layer that was not traced (under that layer's own FQNs).
        ``names_modules``: each value is a tuple of module FQNs, those inside the layer
        renamed with it."""
        last = KEPT_LAYERS - 1
        out = dict(table)
        for fqn, value in table.items():
            if self.layer_of(fqn) == last:
                for index in range(KEPT_LAYERS, self.count):
                    copied = value
                    if names_modules:
                        copied = tuple(self.rename(m, index) if self.layer_of(m) == last else m for m in value)
                    out[self.rename(fqn, index)] = copied
        return out


def laid_out_alike(blocks: RepeatedBlocks | None, *tables: dict) -> bool:
    """Whether each table (FQN -> layout) gives every layer of ``blocks`` the same entries:
    what planning the layers as one (``solve/tie.py``) can honour. A table may name some
    layers only; tying lays the others out the same way."""
    if blocks is None:
        return True
    for table in tables:
        seen: dict[str, object] = {}
        for fqn, value in table.items():
            if blocks.layer_of(fqn) is not None and seen.setdefault(blocks.rename(fqn, 0), value) != value:
                return False
    return True


def find_repeated_blocks(model: nn.Module) -> RepeatedBlocks | None:
    """The largest stack of identical layers, or None when the model has none."""
    best, best_size = None, 0
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < MIN_LAYERS:
            continue
        layers = list(module)
        if not all(isinstance(layer, nn.Module) for layer in layers):
            # x-transformers keeps each layer's norms as ``[norm, None, None]``: a list
            # with empty slots is no stack of layers (its entries are no modules to trace)
            continue
        signature = _layer_signature(layers[0])
        if not signature[1] or any(_layer_signature(layer) != signature for layer in layers[1:]):
            continue
        if _shares_parameters(layers):
            continue  # layers sharing weights (ALBERT-style) are one parameter, not N copies
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = RepeatedBlocks(fqn, len(layers), type(layers[0]).__name__), size
    return best


@contextmanager
def truncated(model: nn.Module, blocks: RepeatedBlocks, keep: int = KEPT_LAYERS):
    """Within the block, ``model``'s layer list holds only its first ``keep`` layers."""
    stack = model.get_submodule(blocks.fqn)
    saved = dict(stack._modules)
    stack._modules = {key: saved[key] for key in list(saved)[:keep]}
    try:
        yield model
    finally:
        stack._modules = saved


def _shares_parameters(layers: list[nn.Module]) -> bool:
    seen: set[int] = set()
    for layer in layers:
        ids = {id(p) for p in layer.parameters()}
        if ids & seen:
            return True
        seen |= ids
    return False


def _layer_signature(layer: nn.Module) -> tuple:
    params = tuple(
        (name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in layer.named_parameters(remove_duplicate=False)
    )
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in layer.named_buffers())
    modules = tuple((name, type(m).__name__) for name, m in layer.named_modules())
    return type(layer), params, buffers, modules


def tied_fingerprint(cut_fingerprint: str, blocks: RepeatedBlocks) -> str:
    """The model fingerprint of a tied plan: the cut model's graph and the stack it stands for.

    ``score`` recomputes it from the model (tracing the cut model) to accept the plan.
    """
    digest = hashlib.sha256(f"{cut_fingerprint}|{blocks.fqn}|{blocks.count}|{blocks.layer_class}".encode())
    return "sha256:" + digest.hexdigest()[:32]
