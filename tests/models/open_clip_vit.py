"""open_clip's CLIP ViT-B/32, its config as open_clip ships it with only the sizes changed,
trained with open_clip's own contrastive loss (``ClipLoss``) on one batch of image-text
pairs. Its towers' blocks attend with ``nn.MultiheadAttention``, whose forward reads its
``out_proj``'s weight and bias itself (``F.multi_head_attention_forward``), never calling
``out_proj``.
"""

import open_clip
import torch

BATCH, IMAGE, CONTEXT, VOCAB = 8, 32, 16, 256
_LOSS = open_clip.ClipLoss()


def build_model():
    config = open_clip.get_model_config("ViT-B-32")
    config["embed_dim"] = 32
    config["vision_cfg"].update(image_size=IMAGE, patch_size=8, width=64, head_width=16, layers=2)
    config["text_cfg"].update(context_length=CONTEXT, vocab_size=VOCAB, width=64, heads=4, layers=2)
    return open_clip.CLIP(**config)


def example_inputs():
    return {"image": torch.randn(BATCH, 3, IMAGE, IMAGE), "text": torch.randint(0, VOCAB, (BATCH, CONTEXT))}


def compute_loss(output, batch):
    image_features, text_features, logit_scale = output
    return _LOSS(image_features, text_features, logit_scale)
