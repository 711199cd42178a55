"""A block with a router that scores tokens in full precision, the way torchtitan's MoE router
does: ``torch.autocast(device_type=x.device.type, enabled=False)`` around its matmul.

On meta tensors ``x.device.type`` is "meta", which torch's autocast refuses; autoplan's trace
must cope. ``build_autocast_on`` asks for autocast there instead (bf16 on a device).
"""

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, EXPERTS, TOKENS = 32, 4, 64


class RoutedMLP(nn.Module):
    def __init__(self, autocast_enabled: bool = False):
        super().__init__()
        self.autocast_enabled = autocast_enabled
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, enabled=self.autocast_enabled):
            scores = F.linear(x.float(), self.router.weight.float())
        gate = scores.softmax(dim=-1).max(dim=-1, keepdim=True).values
        y = x + gate * self.down(F.gelu(self.up(x)))
        return self.out(y).pow(2).mean()


def build_model():
    return RoutedMLP()


def build_autocast_on():
    return RoutedMLP(autocast_enabled=True)


def example_inputs():
    return (torch.randn(TOKENS, WIDTH),)
