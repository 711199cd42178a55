"""A text classifier on torch's own ``nn.TransformerEncoder``, as its tutorial builds one, with
only the sizes changed. Its layers attend with ``nn.MultiheadAttention``, whose forward
reads its ``out_proj``'s weight and bias itself (``F.multi_head_attention_forward``),
never calling ``out_proj``. The labels are read by the loss only (``LOSS_INPUTS``).
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ, VOCAB, WIDTH, CLASSES = 8, 16, 256, 64, 4
LOSS_INPUTS = ("labels",)


class TextClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(d_model=WIDTH, nhead=4, dim_feedforward=4 * WIDTH, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def build_model():
    return TextClassifier()


def example_inputs():
    return {"tokens": torch.randint(0, VOCAB, (BATCH, SEQ)), "labels": torch.randint(0, CLASSES, (BATCH,))}


def compute_loss(output, batch):
    return F.cross_entropy(output, batch["labels"])
