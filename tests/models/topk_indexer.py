"""Attention over the keys a small indexer picks, as DeepSeek V3.2's sparse attention does.

The indexer scores every key with projections of its own and hands the attention only the
indices of the top-k keys (``DeepseekV32Indexer``, run under ``torch.no_grad``); the
attention masks out the others. No gradient goes back through the indices.
"""

import torch
from torch import nn

BATCH, SEQ, HIDDEN, TOPK = 8, 32, 64, 8


class Indexer(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.wk = nn.Linear(HIDDEN, HIDDEN, bias=False)

    @torch.no_grad()
    def forward(self, x):
        scores = torch.relu(self.wq(x) @ self.wk(x).transpose(-1, -2))
        return scores.topk(TOPK, dim=-1).indices


class SparseAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.indexer = Indexer()
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.v_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        picked = self.indexer(x)
        mask = torch.full((x.shape[0], SEQ, SEQ), float("-inf"), device=x.device).scatter(-1, picked, 0.0)
        scores = self.q_proj(x) @ self.k_proj(x).transpose(-1, -2) * HIDDEN**-0.5 + mask
        return self.o_proj(scores.softmax(-1) @ self.v_proj(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(HIDDEN, HIDDEN)
        self.attn = SparseAttention()

    def forward(self, x):
        x = self.embed(x)
        return (x + self.attn(x)).pow(2).mean()


def build_model():
    return Model()


def example_inputs():
    return (torch.randn(BATCH, SEQ, HIDDEN),)
