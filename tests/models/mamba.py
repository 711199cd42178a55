"""HuggingFace Mamba, its config as shipped with only the sizes changed.

Without the ``causal_conv1d`` kernels installed, each mixer runs transformers' reference
convolution on its own: ``F.conv1d(x, self.conv1d.weight.unsqueeze(1), groups=channels)``,
reading the convolution's weight without ever calling the ``conv1d`` module.
"""

import torch
from transformers import MambaConfig, MambaForCausalLM

BATCH, SEQ, VOCAB = 8, 16, 512


def build_model():
    config = MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=16, num_hidden_layers=2, time_step_rank=4)
    return MambaForCausalLM(config)


def example_inputs():
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ)), "labels": torch.randint(0, VOCAB, (BATCH, SEQ))}
