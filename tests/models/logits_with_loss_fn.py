"""A model that returns logits, and the model file's ``compute_loss`` that makes the loss.

The batch is a dict; the forward takes the targets too (the model is called with the whole
batch) and leaves them to the loss, as a training loop would.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, SEQ, BATCH = 64, 32, 16, 8


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, targets=None):
        x = self.embed(input_ids)
        x = x + self.down(F.gelu(self.up(x)))
        return self.head(x)


def build_model():
    return TinyLM()


def example_inputs():
    return dict(
        input_ids=torch.randint(0, VOCAB, (BATCH, SEQ)),
        targets=torch.randint(0, VOCAB, (BATCH, SEQ)),
    )


def compute_loss(output, batch):
    return F.cross_entropy(output.flatten(0, 1), batch["targets"].flatten())
