"""BERT (HuggingFace ``BertForMaskedLM``): an encoder with an attention mask.

The batch has keyword inputs ``input_ids``, ``attention_mask`` (the last quarter of every
sequence is padding) and ``labels`` (-100 where the loss ignores a token). The decoder of
the masked-LM head is tied to the word embedding. ``build_model`` is tiny; ``make_big``
has bert-base's real widths (768, 12 heads, vocab 30522) with 2 layers.
"""

import torch
from transformers import BertConfig, BertForMaskedLM

_shape = {"vocab": 256, "batch": 8, "seq": 32}


def build_model():
    return _bert(vocab=256, width=64, heads=4, layers=2, inter=128, batch=8, seq=32)


def make_big():
    return _bert(vocab=30522, width=768, heads=12, layers=2, inter=3072, batch=8, seq=512)


def example_inputs():
    batch, seq = _shape["batch"], _shape["seq"]
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[:, seq - seq // 4:] = 0
    labels = torch.randint(0, _shape["vocab"], (batch, seq))
    labels[:, ::3] = -100
    return dict(
        input_ids=torch.randint(0, _shape["vocab"], (batch, seq)),
        attention_mask=attention_mask,
        labels=labels,
    )


def _bert(vocab, width, heads, layers, inter, batch, seq):
    _shape.update(vocab=vocab, batch=batch, seq=seq)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=max(seq, 64),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        tie_word_embeddings=True,
    )
    return BertForMaskedLM(config)
