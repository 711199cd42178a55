"""The rows of ``vision_coverage.py``: vision, diffusion and contrastive models as their
libraries build them, each written out as a model file (``autoplan/model_file.py``).

- ``timm:FAMILY``: one model per module of timm's registry (``timm.list_modules()``): the
  family's smallest registered model (parameters counted on the meta device), made smaller
  still where the family's constructor takes the usual size arguments (``depth``,
  ``depths``, ``embed_dim``, ...; the first set that builds and runs a forward is kept),
  at the smallest image size it accepts among 32, 64 and its own; a classifier of 8 classes
  trained with cross-entropy.
- ``diffusers:CLASS``: the transformer and UNet denoisers (DiT, PixArt, SD3, Flux,
  UNet2DConditionModel), built tiny from their constructors, trained with the denoising
  loss (mean squared error against the noise).
- ``open_clip:CONFIG``: open_clip's model configs (``open_clip.list_models()``) with the
  tower sizes shrunk; configs that shrink to the same towers are one row (the first name).
  Configs whose towers come from HuggingFace (``hf_model_name``: a config downloaded) or
  from timm (``timm_model_name``: a timm model at its shipped size, which the config cannot
  shrink; timm's families are rows of their own) are left out, and so is CoCa
  (``multimodal_cfg``: a captioning decoder, another model class). Trained with open_clip's
  ``ClipLoss``.
- ``x_transformers:decoder`` / ``x_transformers:encoder``: a ``TransformerWrapper`` of a
  ``Decoder`` trained through ``AutoregressiveWrapper`` (its own loss), and of an ``Encoder``
  with cross-entropy on token labels.

Until the model file can say which part of the batch only the loss reads (issue 49),
models that take no target are wrapped to accept it and ignore it, and diffusers models are
called with ``return_dict=False``.
"""

from __future__ import annotations

import importlib.util
import json

SOURCES = ("diffusers", "timm", "open_clip", "x_transformers")
DIFFUSERS_CLASSES = ("DiTTransformer2DModel", "PixArtTransformer2DModel", "SD3Transformer2DModel",
                     "FluxTransformer2DModel", "UNet2DConditionModel")


def installed(source: str) -> bool:
    """Whether ``source`` imports here (timm and open_clip need a torchvision built for this torch)."""
    if importlib.util.find_spec(source) is None:
        return False
    try:
        __import__(source)
    except Exception:  # a torchvision built for another torch fails in many ways
        return False
    return True


def registry_rows() -> list[tuple[str, str]]:
    """(source, name) of every row, in order; a source not installed gives one row ``(source, "")``."""
    rows: list[tuple[str, str]] = []
    for source in SOURCES:
        if not installed(source):
            rows.append((source, ""))
        elif source == "diffusers":
            rows += [("diffusers", name) for name in DIFFUSERS_CLASSES]
        elif source == "timm":
            import timm

            rows += [("timm", module) for module in timm.list_modules()]
        elif source == "open_clip":
            rows += [("open_clip", name) for name in _open_clip_configs()]
        else:
            rows += [("x_transformers", "decoder"), ("x_transformers", "encoder")]
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found = {"torch": torch.__version__}
    for source in SOURCES:
        try:
            found[source] = version(_DISTRIBUTIONS[source]) if installed(source) else "not installed"
        except PackageNotFoundError:
            found[source] = getattr(__import__(source), "__version__", "?")
    return found


_DISTRIBUTIONS = {"diffusers": "diffusers", "timm": "timm", "open_clip": "open_clip_torch", "x_transformers": "x-transformers"}


def class_name(source: str, name: str) -> str:
    return {"diffusers": name, "timm": f"timm.models.{name}", "open_clip": "open_clip.CLIP",
            "x_transformers": "x_transformers.TransformerWrapper"}.get(source, name)


def model_file_text(source: str, name: str) -> str:
    if source == "diffusers":
        return _DIFFUSERS_HEAD + _DIFFUSERS[name]
    if source == "timm":
        return _TIMM.replace("FAMILY_NAME", repr(name))
    if source == "open_clip":
        return _OPEN_CLIP.replace("CONFIG_JSON", repr(json.dumps(_shrunk_clip_config(name), sort_keys=True)))
    if source == "x_transformers":
        return _X_TRANSFORMERS[name]
    raise ValueError(f"unknown source {source!r}")


# ---- open_clip ---------------------------------------------------------------------------

def _shrunk_clip_config(name: str) -> dict:
    import open_clip

    config = json.loads(json.dumps(open_clip.get_model_config(name)))
    config["embed_dim"] = 32
    vision, text = config.get("vision_cfg", {}), config.get("text_cfg", {})
    vision.update(image_size=32, width=64, patch_size=8)
    vision["layers"] = [1, 1, 1, 1] if isinstance(vision.get("layers"), (list, tuple)) else 2
    if "head_width" in vision:
        vision["head_width"] = 32
    text.update(context_length=16, vocab_size=100, width=64, heads=2, layers=2)
    for key in ("timm_model_pretrained", "hf_model_pretrained"):
        if key in vision:
            vision[key] = False
    return config


def _open_clip_configs() -> list[str]:
    """One config name per distinct shrunk architecture (towers not from HuggingFace)."""
    import open_clip

    seen: dict[str, str] = {}
    for name in open_clip.list_models():
        config = open_clip.get_model_config(name)
        if config is None or any(key in config.get(tower, {}) for key in ("hf_model_name", "timm_model_name")
                                 for tower in ("text_cfg", "vision_cfg")) or "multimodal_cfg" in config:
            continue
        seen.setdefault(json.dumps(_shrunk_clip_config(name), sort_keys=True), name)
    return list(seen.values())


_OPEN_CLIP = '''"""open_clip CLIP, its config shrunk, trained with open_clip's ClipLoss."""
import json

import open_clip
import torch

BATCH = 8
CONFIG = json.loads(CONFIG_JSON)


def build_model():
    return open_clip.CLIP(**CONFIG, output_dict=True) if "custom_text" not in CONFIG else open_clip.CustomTextCLIP(
        **{k: v for k, v in CONFIG.items() if k != "custom_text"}, output_dict=True)


def example_inputs():
    size = CONFIG["vision_cfg"]["image_size"]
    return {"image": torch.randn(BATCH, 3, size, size), "text": torch.randint(0, 100, (BATCH, 16))}


def compute_loss(output, batch):
    return open_clip.ClipLoss()(output["image_features"], output["text_features"], output["logit_scale"])
'''


# ---- timm --------------------------------------------------------------------------------

_TIMM = '''"""timm: the smallest model of one family, made smaller where its constructor allows."""
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import timm

FAMILY = FAMILY_NAME
BATCH, CLASSES = 8, 8
SHRINK = (
    {"depth": 2, "embed_dim": 64, "num_heads": 2},
    {"depths": (1, 1, 1, 1), "embed_dim": 32, "num_heads": (1, 2, 4, 8)},
    {"depths": (1, 1), "embed_dim": 32, "num_heads": (2, 4)},
    {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)},
    {"depths": (1, 1, 1, 1)},
    {"layers": (1, 1, 1, 1)},
    {},
)
_CHOSEN = {}


class Classifier(torch.nn.Module):
    """The timm model, taking the labels only the loss reads (and ignoring them)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, pixel_values, labels=None):
        return self.net(pixel_values)


def _params(name, kwargs):
    with torch.device("meta"):
        net = timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs)
    return sum(p.numel() for p in net.parameters())


def _choose():
    """(model name, constructor arguments, image size): of the family's three smallest
    models, made as small as the first size arguments it takes allow, the smallest that
    builds and trains on a batch of two images on the CPU. Chosen once, then read from a
    file beside this one, so that every process (each gloo rank) builds the same model."""
    if _CHOSEN:
        return _CHOSEN["choice"]
    saved = Path(__file__).with_suffix(".choice.json")
    if saved.exists():
        _CHOSEN["choice"] = tuple(json.loads(saved.read_text()))
        return _CHOSEN["choice"]
    sized = []
    for name in timm.list_models(module=FAMILY)[:60]:
        try:
            sized.append((_params(name, {}), name))
        except Exception:
            continue
    best = None
    for _, name in sorted(sized)[:3]:
        cfg = timm.get_pretrained_cfg(name)
        native = cfg.input_size[-1] if cfg is not None else 224
        for shrink in SHRINK:
            found = _first_that_trains(name, shrink, native, best)
            if found is not None:
                best = found
                break
    if best is None:
        raise RuntimeError(f"no model of timm family {FAMILY} builds tiny")
    _CHOSEN["choice"] = best[1:]
    saved.write_text(json.dumps(best[1:]))
    return best[1:]


def _first_that_trains(name, shrink, native, best):
    for size in sorted({32, 64, native}):
        for with_size in ({"img_size": size}, {}):
            kwargs = {**shrink, **with_size}
            try:
                count = _params(name, kwargs)
                if best is not None and count >= best[0]:
                    return None
                with torch.device("cpu"):
                    torch.manual_seed(0)
                    net = timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs)
                    net(torch.randn(2, 3, size, size)).sum().backward()
            except Exception:
                continue
            return (count, name, kwargs, size)
    return None


def build_model():
    name, kwargs, _ = _choose()
    return Classifier(timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs))


def example_inputs():
    _, _, size = _choose()
    return {"pixel_values": torch.randn(BATCH, 3, size, size), "labels": torch.randint(0, CLASSES, (BATCH,))}


def compute_loss(output, batch):
    return F.cross_entropy(output, batch["labels"])
'''


# ---- x-transformers ----------------------------------------------------------------------

_X_TRANSFORMERS = {
    "decoder": '''"""x-transformers decoder, trained through its AutoregressiveWrapper (its own loss)."""
import torch
from x_transformers import AutoregressiveWrapper, Decoder, TransformerWrapper

BATCH, SEQ, VOCAB = 8, 16, 64


def build_model():
    return AutoregressiveWrapper(TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ,
                                                    attn_layers=Decoder(dim=32, depth=2, heads=4)))


def example_inputs():
    return (torch.randint(0, VOCAB, (BATCH, SEQ)),)
''',
    "encoder": '''"""x-transformers encoder, trained with cross-entropy on token labels."""
import torch
import torch.nn.functional as F
from x_transformers import Encoder, TransformerWrapper

BATCH, SEQ, VOCAB = 8, 16, 64


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = TransformerWrapper(num_tokens=VOCAB, max_seq_len=SEQ, attn_layers=Encoder(dim=32, depth=2, heads=4))

    def forward(self, tokens, labels=None):
        return self.net(tokens)


def build_model():
    return Tagger()


def example_inputs():
    return {"tokens": torch.randint(0, VOCAB, (BATCH, SEQ)), "labels": torch.randint(0, VOCAB, (BATCH, SEQ))}


def compute_loss(output, batch):
    return F.cross_entropy(output.reshape(-1, VOCAB), batch["labels"].reshape(-1))
''',
}


# ---- diffusers ---------------------------------------------------------------------------

_DIFFUSERS_HEAD = '''"""diffusers denoiser, built tiny from its constructor, trained with the denoising loss."""
import torch
import torch.nn.functional as F
import diffusers

BATCH = 8


def compute_loss(output, batch):
    return F.mse_loss(output, batch["target"])
'''

_DIFFUSERS = {
    "DiTTransformer2DModel": '''

class Denoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                                   num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=1000)

    def forward(self, hidden_states, timestep, class_labels, target=None):
        return self.net(hidden_states, timestep=timestep, class_labels=class_labels, return_dict=False)[0]


def build_model():
    return Denoiser()


def example_inputs():
    return {"hidden_states": torch.randn(BATCH, 4, 8, 8), "timestep": torch.randint(0, 1000, (BATCH,)),
            "class_labels": torch.randint(0, 1000, (BATCH,)), "target": torch.randn(BATCH, 4, 8, 8)}
''',
    "PixArtTransformer2DModel": '''

class Denoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = diffusers.PixArtTransformer2DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2, sample_size=8,
            patch_size=2, cross_attention_dim=32, caption_channels=24, use_additional_conditions=False)

    def forward(self, hidden_states, encoder_hidden_states, timestep, target=None):
        return self.net(hidden_states, encoder_hidden_states=encoder_hidden_states, timestep=timestep,
                        added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False)[0]


def build_model():
    return Denoiser()


def example_inputs():
    return {"hidden_states": torch.randn(BATCH, 4, 8, 8), "encoder_hidden_states": torch.randn(BATCH, 6, 24),
            "timestep": torch.randint(0, 1000, (BATCH,)), "target": torch.randn(BATCH, 4, 8, 8)}
''',
    "SD3Transformer2DModel": '''

class Denoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = diffusers.SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=16, out_channels=4,
            pos_embed_max_size=16)

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, target=None):
        return self.net(hidden_states, encoder_hidden_states=encoder_hidden_states,
                        pooled_projections=pooled_projections, timestep=timestep, return_dict=False)[0]


def build_model():
    return Denoiser()


def example_inputs():
    return {"hidden_states": torch.randn(BATCH, 4, 8, 8), "encoder_hidden_states": torch.randn(BATCH, 6, 32),
            "pooled_projections": torch.randn(BATCH, 16), "timestep": torch.randint(0, 1000, (BATCH,)),
            "target": torch.randn(BATCH, 4, 8, 8)}
''',
    "FluxTransformer2DModel": '''
IMAGE_TOKENS, TEXT_TOKENS = 16, 6


class Denoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, target=None):
        return self.net(hidden_states, encoder_hidden_states=encoder_hidden_states,
                        pooled_projections=pooled_projections, timestep=timestep, img_ids=img_ids, txt_ids=txt_ids,
                        return_dict=False)[0]


def build_model():
    return Denoiser()


def example_inputs():
    return {"hidden_states": torch.randn(BATCH, IMAGE_TOKENS, 16), "encoder_hidden_states": torch.randn(BATCH, TEXT_TOKENS, 32),
            "pooled_projections": torch.randn(BATCH, 16), "timestep": torch.rand(BATCH),
            "img_ids": torch.randn(IMAGE_TOKENS, 3), "txt_ids": torch.randn(TEXT_TOKENS, 3),
            "target": torch.randn(BATCH, IMAGE_TOKENS, 16)}
''',
    "UNet2DConditionModel": '''
SIZE, CONTEXT = 16, 32


class Denoiser(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = diffusers.UNet2DConditionModel(
            sample_size=SIZE, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=CONTEXT, attention_head_dim=8, norm_num_groups=8)

    def forward(self, sample, timestep, encoder_hidden_states, target=None):
        return self.net(sample, timestep, encoder_hidden_states, return_dict=False)[0]


def build_model():
    return Denoiser()


def example_inputs():
    return {"sample": torch.randn(BATCH, 4, SIZE, SIZE), "timestep": torch.randint(0, 1000, (BATCH,)),
            "encoder_hidden_states": torch.randn(BATCH, 7, CONTEXT), "target": torch.randn(BATCH, 4, SIZE, SIZE)}
''',
}
