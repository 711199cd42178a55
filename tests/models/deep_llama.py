"""A small Llama with four layers, as a user writes one: ``LlamaConfig`` with the sizes
changed, the rest as shipped. Four identical layers are planned as one stack, which the
planner may checkpoint (``tests/integration/solve/test_recompute_choice.py``)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ, VOCAB = 8, 64, 256


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def example_inputs():
    return dict(input_ids=torch.randint(0, VOCAB, (BATCH, SEQ)), labels=torch.randint(0, VOCAB, (BATCH, SEQ)))
