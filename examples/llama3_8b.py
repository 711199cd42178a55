"""Llama-3-8B as it is pretrained: HuggingFace ``LlamaForCausalLM`` with the config Meta
ships (``meta-llama/Meta-Llama-3-8B``'s config.json), bfloat16, all 32 layers, and a
training batch of 64 sequences of 8192 tokens (524,288 tokens per step).

The batch is torchtitan's Llama-3-8B recipe on 64 GPUs: sequences of 8192 tokens (the
model's context length) and one sequence per GPU, 64 in all; on an 8x8 mesh (8 nodes of
8 H100s, tensor parallelism inside a node) each of the 8 data-parallel groups gets 8.
At that size the activations kept for the backward do not fit an 80 GB device without
checkpointing: ``suggest`` decides which layers to recompute. Built on the meta device by
the CLI: no weights are downloaded or allocated.

    autoplan suggest examples/llama3_8b.py --mesh 8x8
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 128256
SEQUENCES, SEQ_LEN = 64, 8192


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
    # from_config honours the dtype (LlamaForCausalLM(config) would build float32).
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
