"""A small CNN classifier for 32x32 RGB images (CIFAR-sized): two 3x3 convs, pool, linear.

No BatchNorm, so every layer is a plain matmul or convolution for the planner.
"""

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def example_inputs():
    return (torch.randn(32, 3, 32, 32),)
