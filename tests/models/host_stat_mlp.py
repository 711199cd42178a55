"""An MLP whose middle layer logs a statistic through NumPy, as training scripts sometimes do.

On the meta device (where autoplan traces) there is nothing to log; on a real device the
layer calls ``.numpy()``, which a distributed tensor cannot do.
"""

import torch
from torch import nn


class LoggedReLU(nn.Module):
    def forward(self, x):
        if x.device.type != "meta":
            self.last_mean = float(x.detach().numpy().mean())
        return torch.relu(x)


def build_model():
    return nn.Sequential(nn.Linear(16, 64), LoggedReLU(), nn.Linear(64, 16))


def example_inputs():
    return (torch.randn(8, 16),)
