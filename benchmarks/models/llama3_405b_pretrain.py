"""Llama-3.1-405B as pretrained at scale: HuggingFace ``LlamaForCausalLM`` with Meta's config
(``meta-llama/Llama-3.1-405B``'s config.json), bfloat16, all 126 layers, a batch of 1024
sequences of 8192 tokens (8.4M tokens per step; Meta's own run grew to 16M), for the
pipeline benchmark:

    autoplan suggest benchmarks/models/llama3_405b_pretrain.py --devices 128

Built on the meta device by the CLI: no weights are downloaded or allocated.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 128256
SEQUENCES, SEQ_LEN = 1024, 8192


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        hidden_act="silu",
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        rms_norm_eps=1e-5,
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        dtype=torch.bfloat16,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
