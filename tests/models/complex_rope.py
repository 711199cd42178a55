"""A Llama-style model in plain PyTorch with rotary embeddings in complex numbers, as Meta's
reference Llama and torchtitan write them: ``freqs_cis`` is a complex buffer, and q and k are
rotated by ``torch.view_as_complex(...) * freqs_cis`` and turned back with ``view_as_real``."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 16, 8
HEAD_DIM = WIDTH // HEADS


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    freqs = torch.outer(torch.arange(end), freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(WIDTH)
        self.wq = nn.Linear(WIDTH, WIDTH, bias=False)
        self.wk = nn.Linear(WIDTH, WIDTH, bias=False)
        self.wv = nn.Linear(WIDTH, WIDTH, bias=False)
        self.wo = nn.Linear(WIDTH, WIDTH, bias=False)
        self.ffn_norm = nn.RMSNorm(WIDTH)
        self.w1 = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.w2 = nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q, k, v = (w(h).view(b, s, HEADS, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary_emb(q, k, freqs_cis)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, WIDTH))
        return x + self.w2(F.silu(self.w1(self.ffn_norm(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(HEAD_DIM, SEQ), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h)).float()


def build_model():
    return Transformer()


def example_inputs():
    return {"tokens": torch.randint(0, VOCAB, (BATCH, SEQ))}


def compute_loss(output, batch):
    return F.cross_entropy(output[:, :-1].flatten(0, 1), batch["tokens"][:, 1:].flatten())
