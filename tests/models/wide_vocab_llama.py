"""A small Llama whose vocabulary is 32 times its width, as in Llama 3 (128256 over 4096):
``LlamaConfig`` with the sizes changed, the rest as shipped. Its logits are its largest
activation, so a budget that forces sharding has the loss computed on logits split by
class (``tests/integration/models/test_loss_parallel.py``)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ, VOCAB = 8, 32, 2048


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def example_inputs():
    return dict(input_ids=torch.randint(0, VOCAB, (BATCH, SEQ)), labels=torch.randint(0, VOCAB, (BATCH, SEQ)))
