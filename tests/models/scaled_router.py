"""A mixture-of-experts router that returns its logits and picks the top experts from them.

GraniteMoE's router computes ``F.linear(hidden, self.weight).float()``, takes the top-k of
those logits in its own forward, and returns the logits too (for the load-balancing loss).
Here the logits are scaled rather than cast, to stay in float32.
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ, HIDDEN, EXPERTS, TOP_K = 8, 32, 64, 8, 2


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, HIDDEN) / HIDDEN**0.5)

    def forward(self, hidden):
        logits = F.linear(hidden, self.weight) * 0.5
        top_logits, _ = logits.topk(TOP_K, dim=-1)
        return logits, top_logits.softmax(-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.router = Router()

    def forward(self, x):
        logits, weights = self.router(self.proj(x))
        return weights.pow(2).mean() + logits.softmax(-1).pow(2).mean()


def build_model():
    return Model()


def example_inputs():
    return (torch.randn(BATCH, SEQ, HIDDEN),)
