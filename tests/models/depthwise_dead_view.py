"""A depthwise causal convolution whose weight its mixer also takes a view of that nothing reads.

Zamba2's and Falcon-H1's mamba mixers (transformers' reference path, without the
``causal_conv1d`` kernels) convolve with ``self.conv1d.weight.squeeze(1)`` and take that
view once more than they use. The traced step keeps the unread view.
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ, CHANNELS, KERNEL = 8, 16, 64, 4


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(CHANNELS, CHANNELS)
        self.conv1d = nn.Conv1d(CHANNELS, CHANNELS, KERNEL, groups=CHANNELS, padding=KERNEL - 1)
        self.out_proj = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x):
        self.conv1d.weight.squeeze(1)  # read for nothing, as the mixers above do
        h = self.in_proj(x).transpose(1, 2)
        weight = self.conv1d.weight.squeeze(1)
        h = F.conv1d(h, weight.unsqueeze(1), self.conv1d.bias, padding=KERNEL - 1, groups=CHANNELS)[..., :SEQ]
        return self.out_proj(F.silu(h).transpose(1, 2))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = Mixer()

    def forward(self, x):
        return self.mixer(x).pow(2).mean()


def build_model():
    return Model()


def example_inputs():
    return (torch.randn(BATCH, SEQ, CHANNELS),)
