"""A small residual MLP with the randomness vision models ship: dropout and stochastic depth
(timm's ``drop_path``: a path kept per sample with ``keep_prob + torch.rand(...)``, floored)."""

import torch
from torch import nn

WIDTH, BATCH, DROP_PATH = 32, 16, 0.1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        keep = 1 - DROP_PATH
        kept = (keep + torch.rand(x.shape[0], 1, dtype=x.dtype, device=x.device)).floor_()
        return x + self.drop(torch.relu(self.fc(x))) * kept / keep


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(BATCH, 8),)
