"""diffusers' ``UNet2DConditionModel`` (Stable Diffusion's denoiser) as its users train it,
its config as shipped with only the sizes changed: the noise added to a latent predicted
under text conditioning, the loss the mean squared error against that noise, which only
the loss reads (``LOSS_INPUTS``). The UNet runs its blocks at two resolutions.
"""

import torch
import torch.nn.functional as F
from diffusers import UNet2DConditionModel

BATCH, LATENT, CHANNELS, TEXT, TOKENS = 8, 8, 4, 32, 4
LOSS_INPUTS = ("noise",)


def build_model():
    return UNet2DConditionModel(
        sample_size=LATENT, in_channels=CHANNELS, out_channels=CHANNELS, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=TEXT, attention_head_dim=8,
        norm_num_groups=8,
    )


def example_inputs():
    return {
        "sample": torch.randn(BATCH, CHANNELS, LATENT, LATENT),
        "timestep": torch.randint(0, 1000, (BATCH,)),
        "encoder_hidden_states": torch.randn(BATCH, TOKENS, TEXT),
        "noise": torch.randn(BATCH, CHANNELS, LATENT, LATENT),
    }


def compute_loss(output, batch):
    return F.mse_loss(output.sample, batch["noise"])
