"""A tiny Llama whose sizes do not divide a tensor-parallel degree of 4.

2 key/value heads (fewer than tp = 4), a vocabulary of 50257 (GPT-2's, odd) and an
intermediate size of 90 (not a multiple of 4). The planner must either shard such dims
correctly or leave them whole; it must never produce a plan that crashes or computes a
different result.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 50257
BATCH, SEQ_LEN = 8, 16


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=90,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config)


def example_inputs():
    shape = (BATCH, SEQ_LEN)
    return dict(input_ids=torch.randint(0, VOCAB_SIZE, shape), labels=torch.randint(0, VOCAB_SIZE, shape))
