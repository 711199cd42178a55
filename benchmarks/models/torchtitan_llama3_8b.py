"""torchtitan's Llama 3 at its ``8B`` flavour's widths, cut to 2 layers, as its trainer builds
it (``llama3.model_registry("8B")``), for the baselines benchmark on 8x8 and 2x4:

    python benchmarks/baselines.py benchmarks/models/torchtitan_llama3_8b.py --mesh 8x8

Needs torchtitan, installed with ``--no-deps`` (docs/models.md, "Measuring it"). The inner
attention is torchtitan's own ``ScaledDotProductAttention`` module instead of the flavour's
FlexAttention: the same shapes and weights, and the module a CPU can run. The batch is
8 x 1024 tokens, as ``examples/llama3.py``: one sequence per rank of a data-parallel axis of 8.
The loss is torchtitan's trainer loss (``plain_models.torchtitan_loss``).
"""

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: plain_models

BATCH, SEQ_LEN, LAYERS = 8, 1024, 2


def build_model():
    from torchtitan.models import llama3
    from torchtitan.models.common.attention import ScaledDotProductAttention

    config = llama3.model_registry("8B").model

    def with_sdpa(layer):
        attention = dataclasses.replace(layer.attention, inner_attention=ScaledDotProductAttention.Config())
        return dataclasses.replace(layer, attention=attention)

    config = dataclasses.replace(config, layers=[with_sdpa(layer) for layer in config.layers[:LAYERS]])
    with torch.device("meta"):
        return config.build()


def example_inputs():
    return {"tokens": torch.randint(0, 128256, (BATCH, SEQ_LEN))}


def compute_loss(output, batch):
    from plain_models import torchtitan_loss

    return torchtitan_loss(output, batch)
