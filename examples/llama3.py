"""Llama-3 shapes (1B, 8B, 70B, 405B) as HuggingFace ``LlamaForCausalLM`` in bfloat16, all layers.

``build_model`` is Llama-3-8B (32 layers, hidden 4096, 32 heads, 8 kv heads, intermediate
14336, vocab 128256); ``make_70b`` (80 layers, 8192, 64 heads, 8 kv heads, 28672) and
``make_405b`` (126 layers, 16384, 128 heads, 8 kv heads, 53248) are the larger ones,
``make_1b`` the Llama-3.2-1B shape (16 layers, 2048, 32 heads, 8 kv heads, 8192, the output
head tied to the embedding), and
``make_8b_8layers`` is the 8B cut to 8 layers (to compare tied and untied planning), and
``make_8b_2layers`` to 2 (the baselines benchmark: one layer's plan, solved in seconds).
Batch 8 x 1024 tokens: it divides every data-parallel axis benchmarked (up to 8), and
its activations (no recomputation) fit an 80 GB device once sharded. Built from ``LlamaConfig``
on the meta device by the CLI: no weights are downloaded or allocated.

    autoplan suggest examples/llama3.py:make_70b --mesh 8x8
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 128256
BATCH, SEQ_LEN = 8, 1024
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
    "405b": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128),
}


def build_model():
    return _llama3("8b")


def make_1b():
    return _llama3("1b")


def make_70b():
    return _llama3("70b")


def make_405b():
    return _llama3("405b")


def make_8b_8layers():
    return _llama3("8b", num_hidden_layers=8)


def make_8b_2layers():
    return _llama3("8b", num_hidden_layers=2)


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
    )


def _llama3(size: str, **overrides):
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        dtype=torch.bfloat16,
        **{"tie_word_embeddings": False, **SHAPES[size], **overrides},
    )
    # from_config honours the dtype (LlamaForCausalLM(config) would build float32).
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
