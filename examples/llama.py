"""A tiny HuggingFace Llama (2 layers, hidden 64, vocab 256) built from a config in code.

Small enough to plan in seconds; ``examples/llama_7b.py`` is the Llama-2-7B-shaped version.
No weights are downloaded: the model is built from ``LlamaConfig`` on the meta device.
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB_SIZE = 256
BATCH, SEQ_LEN = 8, 32


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        attn_implementation="eager",
        use_cache=False,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config)


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN)),
    )
