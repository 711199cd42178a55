"""HuggingFace image classifiers whose backward runs ops DTensor has no rule for, configs as
shipped with only the sizes changed.

MobileNetV2's ReLU6 is ``hardtanh``, which DTensor rules as pointwise, but not its backward
op ``hardtanh_backward``; PoolFormer pools with ``avg_pool2d`` and normalises with group
norm, whose backward ops ``avg_pool2d_backward`` and ``native_group_norm_backward`` have
no rule either. Each step failed in the backward before.
"""

import torch
from transformers import (
    MobileNetV2Config,
    MobileNetV2ForImageClassification,
    PoolFormerConfig,
    PoolFormerForImageClassification,
)

BATCH, IMAGE, LABELS = 8, 32, 4


def mobilenet_v2():
    return MobileNetV2ForImageClassification(MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25, num_labels=LABELS))


def poolformer():
    config = PoolFormerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=LABELS)
    return PoolFormerForImageClassification(config)


def example_inputs():
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE), "labels": torch.randint(0, LABELS, (BATCH,))}
