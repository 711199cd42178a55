"""timm's ConvNeXt as timm's users build one (``timm.create_model``, no weights), convnext_atto
with only the sizes changed, trained as timm's train script trains a classifier: cross
entropy on the labels, which the model takes no argument for (``LOSS_INPUTS``).

Its ``LayerNorm2d`` normalises over channels through a permute and leaves the tensor
channels-last; the device's convolution keeps that layout (torch's meta convolution
returns a contiguous result), and the head's ``AdaptiveAvgPool2d`` pools a channels-last
tensor with a mean and an in-place restride (``as_strided_``).
"""

import timm
import torch
import torch.nn.functional as F

BATCH, IMAGE, CLASSES = 8, 32, 10
LOSS_INPUTS = ("labels",)


def build_model():
    return timm.create_model("convnext_atto", pretrained=False, num_classes=CLASSES, depths=(1, 1, 2, 1),
                             dims=(16, 32, 64, 128))


def example_inputs():
    return {"x": torch.randn(BATCH, 3, IMAGE, IMAGE), "labels": torch.randint(0, CLASSES, (BATCH,))}


def compute_loss(output, batch):
    return F.cross_entropy(output, batch["labels"])
