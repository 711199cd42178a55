"""HuggingFace Swin image classifier, its config as shipped with only the sizes changed.

Its pooler is ``nn.AdaptiveAvgPool1d`` over the transposed token sequence; torch pools that
channels-last input to one element with a mean and then restrides the result in place
(``as_strided_``), which DTensor runs in no layout.
"""

import torch
from transformers import SwinConfig, SwinForImageClassification

BATCH, IMAGE = 8, 32


def build_model():
    config = SwinConfig(
        image_size=IMAGE, patch_size=2, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=2, num_labels=4,
    )
    return SwinForImageClassification(config)


def example_inputs():
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE), "labels": torch.randint(0, 4, (BATCH,))}
