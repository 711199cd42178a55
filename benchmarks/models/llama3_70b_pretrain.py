"""Llama-3-70B as pretrained at scale: HuggingFace ``LlamaForCausalLM`` with Meta's config
(``meta-llama/Meta-Llama-3-70B``'s config.json), bfloat16, all 80 layers, a batch of 1024
sequences of 8192 tokens (8.4M tokens per step), for the pipeline benchmark:

    autoplan suggest benchmarks/models/llama3_70b_pretrain.py --devices 64

Built on the meta device by the CLI: no weights are downloaded or allocated.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 128256
SEQUENCES, SEQ_LEN = 1024, 8192


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
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
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
