"""An image classifier from timm, as timm's users build one: ``timm.create_model`` with no
weights (nothing is downloaded), ViT-Tiny/16's config with only the sizes changed, trained
with cross entropy on the labels, as timm's train script does.

The model's forward takes the images only; the labels are read by the loss alone, which
``LOSS_INPUTS`` says: autoplan calls the model without them and hands ``compute_loss`` the
whole batch. timm needs torchvision, which must be the build for your torch
(``docs/models.md``).
"""

import timm
import torch
import torch.nn.functional as F

BATCH, IMAGE, CLASSES = 32, 32, 10
LOSS_INPUTS = ("labels",)


def build_model():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=CLASSES, img_size=IMAGE,
                             patch_size=8, depth=4)


def example_inputs():
    return {"x": torch.randn(BATCH, 3, IMAGE, IMAGE), "labels": torch.randint(0, CLASSES, (BATCH,))}


def compute_loss(output, batch):
    return F.cross_entropy(output, batch["labels"])
