"""torch's own DTensor test ``Transformer`` (``torch.testing._internal``): a plain-PyTorch
decoder with learned position embeddings, LayerNorm and an output layer tied to the token
embedding. Dropout is off so runs are deterministic. ``build_model`` is tiny;
``make_big`` is 1024 wide with 16 heads and a 32000 vocabulary, 2 layers.
"""

import torch
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

_shape = {"vocab": 64, "batch": 8, "seq": 16}


def build_model():
    return _transformer(vocab=64, dim=32, heads=4, layers=2, batch=8, seq=16)


def make_big():
    return _transformer(vocab=32000, dim=1024, heads=16, layers=2, batch=8, seq=1024)


def example_inputs():
    return (torch.randint(0, _shape["vocab"], (_shape["batch"], _shape["seq"])),)


def _transformer(vocab, dim, heads, layers, batch, seq):
    _shape.update(vocab=vocab, batch=batch, seq=seq)
    args = ModelArgs(
        n_layers=layers, vocab_size=vocab, max_seq_len=seq, dim=dim, n_heads=heads,
        dropout_p=0.0, weight_tying=True,
    )
    return Transformer(args)
