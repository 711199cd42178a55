"""Llama-3-8B as configured by Meta (``meta-llama/Meta-Llama-3-8B``'s config.json),
bfloat16, all 32 layers, at a training batch of 64 sequences of 4096 tokens (262,144
tokens per step): the shape issue 45 compares baselines at on an 8x8 mesh.

    python benchmarks/baselines.py benchmarks/models/llama3_8b_4k.py --mesh 8x8
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 128256
SEQUENCES, SEQ_LEN = 64, 4096


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_act="silu",
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        dtype=torch.bfloat16,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def example_inputs():
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
