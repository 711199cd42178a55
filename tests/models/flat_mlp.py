"""A block that runs its MLP on the tokens flattened and views the result back.

AFMoE's shared experts take ``hidden_states.view(-1, hidden)`` and their output is viewed
back to ``(batch, seq, hidden)`` outside them, as many MoE blocks do.
"""

import torch
from torch import nn

BATCH, SEQ, HIDDEN, INTERMEDIATE = 8, 64, 128, 256


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x):
        flat = self.norm(x).view(-1, HIDDEN)
        return x + self.mlp(flat).view(x.shape)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return self.head(self.block(x)).pow(2).mean()


def build_model():
    return Model()


def example_inputs():
    return (torch.randn(BATCH, SEQ, HIDDEN),)
