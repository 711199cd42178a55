"""A Llama in plain PyTorch with torchtitan's fused projections: one ``wqkv`` linear for
queries, keys and values (grouped per key/value head), ``w1``/``w3``/``w2`` SwiGLU, RMSNorm,
``tok_embeddings`` and an ``output`` head; given targets it returns ``(logits, loss)``, as
nanoGPT does."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, KV_HEADS, HIDDEN, LAYERS, BATCH, SEQ = 256, 64, 4, 2, 128, 2, 8, 16
HEAD_DIM = DIM // HEADS


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wqkv = nn.Linear(DIM, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)

    def forward(self, x):
        bsz, seq, _ = x.shape
        # Per key/value head: its query heads, then its key, then its value.
        qkv = self.wqkv(x).view(bsz, seq, KV_HEADS, HEADS // KV_HEADS + 2, HEAD_DIM)
        q, k, v = qkv.split([HEADS // KV_HEADS, 1, 1], dim=3)
        q = q.reshape(bsz, seq, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.reshape(bsz, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.reshape(bsz, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, HEADS * HEAD_DIM))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, targets=None):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        logits = self.output(self.norm(h))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_model():
    return Transformer()


def example_inputs():
    return dict(tokens=torch.randint(0, VOCAB, (BATCH, SEQ)), targets=torch.randint(0, VOCAB, (BATCH, SEQ)))
