"""Issue 45's four HuggingFace configs at real widths, few layers, configs as shipped
(only the sizes changed): a Qwen2-1.5B shape, a Pythia-410m-shaped GPT-NeoX, T5-small
and ViT-Base. Each builder's batch is the one ``example_inputs`` returns after it ran.

    python -m autoplan suggest benchmarks/models/real_width.py:qwen2_1p5b --mesh 2x4
"""

import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
)

_batch: dict = {}


def qwen2_1p5b():
    config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=4,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
    _tokens(config.vocab_size, batch=8, seq=256)
    return Qwen2ForCausalLM(config)


def neox_410m():
    config = GPTNeoXConfig(vocab_size=50304, hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                           num_attention_heads=16)
    _tokens(config.vocab_size, batch=8, seq=256)
    return GPTNeoXForCausalLM(config)


def t5_small():
    config = T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                      decoder_start_token_id=0)
    _batch.clear()
    _batch.update(kind="t5", vocab=config.vocab_size, batch=8, seq=256)
    return T5ForConditionalGeneration(config)


def vit_base():
    config = ViTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072)
    _batch.clear()
    _batch.update(kind="image", batch=16, size=config.image_size)
    return ViTForImageClassification(config)


build_model = qwen2_1p5b


def _tokens(vocab: int, batch: int, seq: int) -> None:
    _batch.clear()
    _batch.update(kind="tokens", vocab=vocab, batch=batch, seq=seq)


def example_inputs():
    kind = _batch.get("kind", "tokens")
    if kind == "image":
        n, size = _batch["batch"], _batch["size"]
        return dict(pixel_values=torch.randn(n, 3, size, size), labels=torch.randint(0, 2, (n,)))
    shape = (_batch["batch"], _batch["seq"])
    ids = torch.randint(0, _batch["vocab"], shape)
    labels = torch.randint(0, _batch["vocab"], shape)  # drawn apart: the batch's tensors must not alias
    if kind == "t5":
        return dict(input_ids=ids, labels=labels)
    return dict(input_ids=ids, labels=labels)
