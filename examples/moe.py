"""A mixture-of-experts decoder: HuggingFace Mixtral (``MixtralForCausalLM``) from a config in code.

Each layer routes every token to its top-2 of 4 experts; transformers' default experts
implementation sorts the tokens by expert and runs all experts in one grouped matmul
(``torch._grouped_mm``), which autoplan plans like any other op, in float32 as in bf16.
``build_model`` is tiny; ``make_big`` has Mixtral-8x7B's
widths (4096, 8 experts of 14336, 32 heads, 8 kv heads, vocab 32000) with 2 layers, bf16.
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

_shape = {"vocab": 256, "batch": 8, "seq": 16}


def build_model():
    return _mixtral(vocab=256, width=64, inter=96, experts=4, heads=4, kv_heads=2, layers=2, batch=8, seq=16)


def make_big():
    model = _mixtral(vocab=32000, width=4096, inter=14336, experts=8, heads=32, kv_heads=8, layers=2, batch=8, seq=2048)
    return model.to(torch.bfloat16)


def example_inputs():
    shape = (_shape["batch"], _shape["seq"])
    return dict(
        input_ids=torch.randint(0, _shape["vocab"], shape),
        labels=torch.randint(0, _shape["vocab"], shape),
    )


def _mixtral(vocab, width, inter, experts, heads, kv_heads, layers, batch, seq):
    _shape.update(vocab=vocab, batch=batch, seq=seq)
    config = MixtralConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_local_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=max(seq, 64),
        router_aux_loss_coef=0.0,
        output_router_logits=False,
        tie_word_embeddings=False,
    )
    return MixtralForCausalLM(config)
