"""A model that reads a row of its embedding's weight in its own code, beside the lookup.

Gemma 4's multimodal model fills the positions of image tokens with the pad token's
embedding, ``self.embed_tokens.weight[pad]`` taken in the model's forward, not in the
embedding's, next to the embedding's own lookup of the other tokens.
"""

import torch
from torch import nn

BATCH, SEQ, VOCAB, HIDDEN, PAD, IMAGE = 8, 2048, 32, 256, 0, 31


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids):
        image = input_ids == IMAGE
        embeds = self.embed_tokens(torch.where(image, PAD, input_ids))
        pad_embedding = self.embed_tokens.weight[PAD, :]
        embeds = torch.where(image[..., None], pad_embedding.view(1, 1, -1), embeds)
        return self.proj(self.norm(embeds))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Backbone()

    def forward(self, input_ids):
        return self.model(input_ids).pow(2).mean()


def build_model():
    return Model()


def example_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    ids[:, :4] = IMAGE
    return (ids,)
