"""A nanoGPT-style language model in plain PyTorch, returning its loss as people do.

``forward(idx, targets)`` returns ``(logits, loss)`` as nanoGPT does (``build_model``); the
same model returning a named tuple (``build_namedtuple``) or a frozen dataclass
(``build_dataclass``) with a ``loss`` field. The loss is the scalar, not the logits.
"""

from collections import namedtuple
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, SEQ, BATCH = 64, 32, 4, 16, 8

LMOutput = namedtuple("LMOutput", ["logits", "loss"])


@dataclass(frozen=True)
class FrozenLMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.mlp_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(WIDTH, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class NamedTupleGPT(GPT):
    def forward(self, idx, targets=None):
        return LMOutput(*super().forward(idx, targets))


class DataclassGPT(GPT):
    def forward(self, idx, targets=None):
        return FrozenLMOutput(*super().forward(idx, targets))


def build_model():
    return GPT()


def build_namedtuple():
    return NamedTupleGPT()


def build_dataclass():
    return DataclassGPT()


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ)))
