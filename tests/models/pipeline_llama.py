"""A small Llama with eight layers, as a user writes one: ``LlamaConfig`` with the sizes
changed, the rest as shipped (untied embeddings, as Llama 3's larger models ship). Eight
layers give an interleaved pipeline of 4 ranks 2 stages each one layer per stage."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ, VOCAB = 8, 16, 256


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=8, max_position_embeddings=SEQ, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def example_inputs():
    return dict(input_ids=torch.randint(0, VOCAB, (BATCH, SEQ)), labels=torch.randint(0, VOCAB, (BATCH, SEQ)))
