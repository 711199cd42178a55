"""diffusers' DiT (``DiTTransformer2DModel``) as its users train it, DiT-XL/2's config with only
the sizes changed: it predicts the noise added to a latent (and, ``learn_sigma``'s out
channels, its variance), and the loss is the mean squared error of that prediction against
the noise. The model takes no noise target: only the loss reads it (``LOSS_INPUTS``).

diffusers returns a ``Transformer2DModelOutput``, a dataclass it registers as a pytree node
without keys.
"""

import torch
import torch.nn.functional as F
from diffusers import DiTTransformer2DModel

BATCH, LATENT, CHANNELS = 8, 8, 4
LOSS_INPUTS = ("noise",)


def build_model():
    return DiTTransformer2DModel(
        num_attention_heads=4, attention_head_dim=8, in_channels=CHANNELS, out_channels=2 * CHANNELS,
        num_layers=3, sample_size=LATENT, patch_size=2,
    )


def example_inputs():
    return {
        "hidden_states": torch.randn(BATCH, CHANNELS, LATENT, LATENT),
        "timestep": torch.randint(0, 1000, (BATCH,)),
        "class_labels": torch.randint(0, 1000, (BATCH,)),
        "noise": torch.randn(BATCH, CHANNELS, LATENT, LATENT),
    }


def compute_loss(output, batch):
    predicted_noise, _ = output.sample.chunk(2, dim=1)  # the rest is the learned variance
    return F.mse_loss(predicted_noise, batch["noise"])
