"""A two-layer MLP block (d -> 4d -> ReLU -> d), the smallest model autoplan plans.

``build_model`` is 1024 wide; ``make_big`` (``examples/mlp.py:make_big``) is 8192 wide.
"""

import torch
from torch import nn

BATCH = 64
# example_inputs is shared by both builders, so each builder records the width it built
# (autoplan calls the builder before example_inputs).
_width = 1024


def build_model() -> nn.Module:
    return _make_mlp(1024)


def make_big() -> nn.Module:
    return _make_mlp(8192)


def example_inputs():
    return (torch.randn(BATCH, _width),)


def _make_mlp(width: int) -> nn.Module:
    global _width
    _width = width
    return nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))
