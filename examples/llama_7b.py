"""Llama-2-7B-shaped HuggingFace Llama in bfloat16, cut to 2 of its 32 layers.

Every layer of the 7B model is the same, so 2 layers show the per-layer plan while the
planner stays fast. Batch 8 x 2048 tokens. Built from ``LlamaConfig`` on the meta device:
no weights are downloaded or allocated.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 32000
BATCH, SEQ_LEN = 8, 2048


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=2,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype=torch.bfloat16,
    )
    # Constructing LlamaForCausalLM(config) directly ignores config.dtype; from_config
    # honours it (parameters bf16, rotary buffers stay fp32 as in HF checkpoints).
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def example_inputs():
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
    )
