"""A small MLP whose hidden activations go through ``torch.renorm``, an op DTensor has no rule for.

The planner must run it replicated (and say so), and the apply engine must still execute it.
"""

import torch
from torch import nn


class RenormMLP(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        hidden = torch.relu(self.up(x))
        hidden = torch.renorm(hidden, p=2, dim=0, maxnorm=1.0)
        return self.down(hidden).pow(2).mean()


def build_model():
    return RenormMLP()


def example_inputs():
    return (torch.randn(16, 32),)
