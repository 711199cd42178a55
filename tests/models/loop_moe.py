"""A mixture-of-experts block written in plain PyTorch, the way many training repos write it.

Each token goes to its top-2 of 4 experts; each expert finds its tokens with
``torch.where`` and adds its outputs back with ``index_add_``, so the shapes inside the
loop depend on the router's choice. autoplan traces that block as one opaque region.
"""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, EXPERTS, TOP_K, BATCH, SEQ = 256, 64, 4, 2, 8, 16


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.up = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(EXPERTS))
        self.down = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(EXPERTS))

    def forward(self, x):
        tokens = x.reshape(-1, WIDTH)
        weights, chosen = torch.topk(F.softmax(self.router(tokens), dim=-1), TOP_K, dim=-1)
        out = torch.zeros_like(tokens)
        for e in range(EXPERTS):
            token, slot = torch.where(chosen == e)
            y = self.down[e](F.gelu(self.up[e](tokens[token])))
            out = out.index_add(0, token, y * weights[token, slot, None])
        return out.reshape(x.shape)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.experts = Experts()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx, targets):
        x = self.embed(idx)
        x = x + self.experts(self.norm(x))
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def build_model():
    return Model()


def example_inputs():
    return torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
