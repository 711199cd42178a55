"""x-transformers' decoder-only language model (``TransformerWrapper`` around a ``Decoder``), as
its README builds it with only the sizes changed. Each of its layers keeps its norms as a
``ModuleList`` with empty slots (``[norm, None, None]``). The wrapper returns logits; the
next-token targets are read by the loss only (``LOSS_INPUTS``).
"""

import torch
import torch.nn.functional as F
from x_transformers import Decoder, TransformerWrapper

BATCH, SEQ, VOCAB = 8, 32, 256
LOSS_INPUTS = ("labels",)


def build_model():
    return TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ, attn_layers=Decoder(dim=64, depth=3, heads=4))


def example_inputs():
    return {"x": torch.randint(0, VOCAB, (BATCH, SEQ)), "labels": torch.randint(0, VOCAB, (BATCH, SEQ))}


def compute_loss(output, batch):
    return F.cross_entropy(output.flatten(0, 1), batch["labels"].flatten())
