"""A head that multiplies by a tied weight in its own code, which a module inside also reads.

NeoMME's masked LM factorizes its embedding: a lookup into a low rank, then a projection
up to the hidden size (``embed.proj``); its head multiplies by the same projection weight,
tied as ``unembed.weight``, with ``hidden @ self.unembed.weight``, in the model's own
forward, back down to the rank before the logits.
"""

import torch
from torch import nn

BATCH, SEQ, VOCAB, RANK, HIDDEN = 8, 512, 64, 128, 256


class FactorizedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.lookup = nn.Embedding(VOCAB, RANK)
        self.proj = nn.Linear(RANK, HIDDEN, bias=False)

    def forward(self, input_ids):
        return self.proj(self.lookup(input_ids))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = FactorizedEmbedding()
        self.norm = nn.LayerNorm(HIDDEN)
        self.mlp = nn.Linear(HIDDEN, HIDDEN)
        self.unembed = nn.Linear(RANK, HIDDEN, bias=False)
        self.unembed.weight = self.embed.proj.weight
        self.head = nn.Linear(RANK, VOCAB, bias=False)

    def forward(self, input_ids, labels):
        hidden = self.mlp(self.norm(self.embed(input_ids)))
        logits = self.head(hidden @ self.unembed.weight)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_model():
    return Model()


def example_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return (ids, torch.roll(ids, -1, dims=1))
