"""GPT-2 (HuggingFace ``GPT2LMHeadModel``) built from a config in code.

Its attention and MLP use ``Conv1D`` layers (weights stored input x output, the transpose
of ``nn.Linear``), q/k/v come out of one fused projection, and the output head is tied to
the input embedding. ``build_model`` is tiny (for numerics); ``make_big`` has GPT-2
small's real widths and vocabulary (768 wide, 12 heads, vocab 50257) with 2 layers.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

_shape = {"vocab": 256, "batch": 8, "seq": 32}


def build_model():
    return _gpt2(vocab=256, width=64, heads=4, layers=2, batch=8, seq=32)


def make_big():
    return _gpt2(vocab=50257, width=768, heads=12, layers=2, batch=8, seq=1024)


def example_inputs():
    shape = (_shape["batch"], _shape["seq"])
    return dict(
        input_ids=torch.randint(0, _shape["vocab"], shape),
        labels=torch.randint(0, _shape["vocab"], shape),
    )


def _gpt2(vocab, width, heads, layers, batch, seq):
    _shape.update(vocab=vocab, batch=batch, seq=seq)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=max(seq, 64),
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return GPT2LMHeadModel(config)
