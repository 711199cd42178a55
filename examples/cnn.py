"""A small CNN classifier for 32x32 RGB images (CIFAR-sized): two 3x3 conv + BatchNorm +
ReLU stages, global average pool, linear.

BatchNorm normalises over the batch, so a data-parallel split changes its statistics
(each rank would see only its slice); the planner must keep the batch dim whole where
BatchNorm reads it, and its running statistics are buffers updated in place.
"""

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, kernel_size=3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def example_inputs():
    return (torch.randn(32, 3, 32, 32),)
