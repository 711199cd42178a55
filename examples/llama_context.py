"""A HuggingFace Llama (``LlamaForCausalLM``, sdpa attention, grouped-query heads) at one
sequence of 4096 tokens, to plan with context parallel: its sequence split over a mesh axis.

Tiny widths (hidden 64, 2 layers, 4 query heads sharing 2 key/value heads, vocab 256) so it
plans in seconds and runs on gloo. The batch is ``causal_lm_batch``'s: position ids and
labels shifted beforehand, and a mask of ones (docs/context-parallel.md).

    autoplan suggest examples/llama_context.py --mesh 4 --axis-names cp --context-axis cp --profile cpu-gloo
"""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from autoplan.sequence_batch import causal_lm_batch

VOCAB, SEQ_LEN = 256, 4096


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return AutoModelForCausalLM.from_config(config)


def example_inputs():
    return causal_lm_batch(torch.randint(0, VOCAB, (1, SEQ_LEN)), torch.randint(0, VOCAB, (1, SEQ_LEN)))
