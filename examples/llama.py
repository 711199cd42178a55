"""HuggingFace Llama (``LlamaForCausalLM``) with grouped-query attention, from a config in code.

``build_model`` is tiny (2 layers, hidden 64, 4 query heads sharing 2 key/value heads,
vocab 256) so it plans in seconds and runs on gloo; ``make_big`` has Llama-3-8B's widths
(4096, 32 heads, 8 kv heads, intermediate 14336, vocab 128256) with 2 layers, in bf16.
``examples/llama_7b.py`` is the Llama-2-7B-shaped version. No weights are downloaded.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

_shape = {"vocab": 256, "batch": 8, "seq": 32}


def build_model():
    return _llama(vocab=256, width=64, inter=160, heads=4, kv_heads=2, layers=2, batch=8, seq=32)


def make_big():
    model = _llama(vocab=128256, width=4096, inter=14336, heads=32, kv_heads=8, layers=2, batch=8, seq=2048)
    return model.to(torch.bfloat16)


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    shape = (_shape["batch"], _shape["seq"])
    return dict(
        input_ids=torch.randint(0, _shape["vocab"], shape),
        labels=torch.randint(0, _shape["vocab"], shape),
    )


def _llama(vocab, width, inter, heads, kv_heads, layers, batch, seq):
    _shape.update(vocab=vocab, batch=batch, seq=seq)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max(seq, 256),
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config)
