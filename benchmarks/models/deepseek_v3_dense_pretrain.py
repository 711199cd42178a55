"""DeepSeek-V3's depth and widths, every layer dense, as pretrained: HuggingFace
``DeepseekV3ForCausalLM`` with the config as shipped (``DeepseekV3Config()``'s defaults are
``deepseek-ai/DeepSeek-V3``'s: 61 layers, hidden 7168, 128 heads of multi-head latent
attention, vocabulary 129280) except that all 61 layers take the dense feed-forward
(intermediate 18432) that V3 gives its first 3, bfloat16, a batch of 1024 sequences of 4096
tokens (V3's pretraining length), for the pipeline benchmark's dense-depth row:

    autoplan suggest benchmarks/models/deepseek_v3_dense_pretrain.py --devices 256

(Routed experts are issue 48's: expert parallel.) Built on the meta device by the CLI: no
weights are downloaded or allocated.
"""

import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config

SEQUENCES, SEQ_LEN = 1024, 4096


def build_model():
    config = DeepseekV3Config(first_k_dense_replace=61, dtype=torch.bfloat16)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def example_inputs():
    vocab = DeepseekV3Config().vocab_size
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, vocab, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, vocab, (SEQUENCES, SEQ_LEN)),
    )
