"""Tiny models written in plain PyTorch, as their libraries ship them, for ``plain_coverage.py``.

Three sources of rows, each named ``source:name``:

- ``torchtitan:FAMILY``: every family under ``torchtitan/models/`` whose ``model_registry``
  builds a ``Decoder`` (a language model), from its smallest flavour (``debugmodel``) with
  the attention the registry picks by default (FlexAttention, or varlen for gpt_oss), and
  ``torchtitan:FAMILY+sdpa``: the same with every inner attention replaced by torchtitan's
  own ``ScaledDotProductAttention`` (the registries refuse ``attn_backend="sdpa"`` for
  language models, yet the class ships and the trainer runs it without masks: the one
  attention with a CPU backward). Shrunk by ``shrink_nested``: the layer list cut to 2
  layers (layer 0 and the layer adding most kinds of block not yet kept: a MoE block after a
  dense one) and ``max_seq_len`` (the rotary tables) cut to 128; the debug widths stay as
  shipped (torchtitan repeats each width in every sub-config, so one renamed size would
  break the others). Loss: torchtitan's trainer loss (``cross_entropy_loss``: cross-entropy
  of float32 logits, sum over tokens) over the number of tokens, the labels being the
  tokens shifted by one (its dataloader's ``input = seq[:-1], labels = seq[1:]``).
- ``litgpt:NAME``: ``litgpt.config.Config.from_name(NAME, **tiny)``, the registry's entry with
  only sizes changed by ``hf_tiny.tiny_values`` (the one table of size knobs), built as
  ``litgpt.model.GPT``; loss as litgpt's pretraining computes it: ``chunked_cross_entropy``
  of the logits against the tokens shifted by one.
- ``nanogpt:gpt``: ``tests/models/nanogpt.py`` (returns ``(logits, loss)``; its own loss).

``model_file_text(row)`` writes a row's model file (``autoplan/model_file.py``'s convention),
which the row's stages (``hf_row.py``) and the gloo numerics import.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
BATCH, SEQ = 8, 16
LITGPT_NAMES = ("pythia-14m", "Llama-3.2-1B", "Gemma-2-2b", "phi-2", "falcon-7b", "Qwen2.5-0.5B",
                "Mixtral-8x7B-v0.1", "Qwen3-30B-A3B")
"""Distinct architectures: GPT-NeoX (parallel residual, LayerNorm), Llama 3 (GQA), Gemma 2
(soft-capping, sliding window, post-norms), Phi-2 (partial rotary), Falcon (multi-query,
parallel), Qwen 2.5 (qkv bias), Mixtral (MoE), Qwen 3 MoE (q/k norms, MoE)."""
SDPA = "+sdpa"
NOT_LANGUAGE_MODELS = ("flux",)
"""Families left out by name: flux is a diffusion model, and its import (which needs
``datasets``) fails before the Decoder check below can tell."""


# ---- the rows ------------------------------------------------------------------------------

def registry_rows() -> list[tuple[str, str]]:
    """``(source, name)`` of every row, torchtitan's families first."""
    rows = []
    for family in torchtitan_families():
        rows += [("torchtitan", family), ("torchtitan", family + SDPA)]
    rows += [("litgpt", name) for name in LITGPT_NAMES]
    return rows + [("nanogpt", "gpt")]


def torchtitan_families() -> list[str]:
    """Subpackages of ``torchtitan.models`` that are language models (their smallest flavour
    builds a ``Decoder``); a family whose registry cannot be imported or called is kept: its
    row says why."""
    import torchtitan.models

    families = []
    for info in pkgutil.iter_modules(torchtitan.models.__path__):
        if not info.ispkg or info.name == "common" or info.name in NOT_LANGUAGE_MODELS:
            continue
        try:
            from torchtitan.models.common.decoder import Decoder

            if isinstance(_torchtitan_config(info.name, sdpa=False), Decoder.Config):
                families.append(info.name)
        except Exception:  # kept: its row records the failure
            families.append(info.name)
    return families


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import litgpt  # noqa: F401

    return {"torch": torch.__version__, "torchtitan": version("torchtitan"), "litgpt": version("litgpt")}


# ---- torchtitan ----------------------------------------------------------------------------

def smallest_flavour(module) -> str:
    """``debugmodel`` where the family's flavour table has one, else its first flavour."""
    tables = [v for k, v in vars(module).items() if k.endswith("_configs") and isinstance(v, dict)]
    flavours = [name for table in tables for name in table]
    return "debugmodel" if "debugmodel" in flavours else flavours[0]


def _torchtitan_config(family: str, sdpa: bool):
    module = importlib.import_module(f"torchtitan.models.{family}")
    config = module.model_registry(smallest_flavour(module)).model
    return shrink_nested(config, sdpa)


def shrink_nested(config, sdpa: bool = False):
    """A torchtitan config tree with its ``layers`` list cut to 2 and ``max_seq_len`` to 128;
    with ``sdpa``, every FlexAttention / varlen inner attention replaced by torchtitan's own
    ``ScaledDotProductAttention``."""
    from hf_tiny import LAYERS, MAX_POSITIONS, _kept_layers
    from torchtitan.models.common.attention import (
        FlexAttention,
        ScaledDotProductAttention,
        VarlenAttention,
    )

    def walk(value):
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return value
        if sdpa and isinstance(value, (FlexAttention.Config, VarlenAttention.Config)):
            return ScaledDotProductAttention.Config()
        changed = {}
        for field in dataclasses.fields(value):
            if not field.init:
                continue
            old = getattr(value, field.name)
            new = old
            if field.name == "layers" and isinstance(old, list) and len(old) > LAYERS:
                kinds = [_kind(layer) for layer in old]
                new = [old[i] for i in _kept_layers({"kinds": kinds}, len(old), LAYERS)]
            elif field.name == "max_seq_len" and isinstance(old, int):
                new = min(old, MAX_POSITIONS)
            new = walk(new)
            if new is not old:
                changed[field.name] = new
        return dataclasses.replace(value, **changed) if changed else value

    return walk(config)


def _kind(layer) -> str:
    """The classes in a layer config's tree: a MoE block differs from a dense one."""
    names = []

    def visit(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names.append(type(value).__qualname__)
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name))

    visit(layer)
    return ",".join(sorted(set(names)))


def build_torchtitan(name: str):
    """The tiny model of ``torchtitan:NAME`` (``FAMILY`` or ``FAMILY+sdpa``), its weights
    initialised as the trainer does (``init_states``)."""
    family, sdpa = name.removesuffix(SDPA), name.endswith(SDPA)
    model = _torchtitan_config(family, sdpa).build()
    model.init_states()
    return model


def torchtitan_inputs(model) -> dict:
    """The trainer's call: ``model(tokens, **extra)``, the token ids and, with FlexAttention or
    varlen, the positions and the masks the trainer builds from them
    (``Decoder.get_attention_masks``), as keyword arguments."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    tokens = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    inner = getattr(model.config.first_attention, "inner_attention", None)
    if inner is None or isinstance(inner, ScaledDotProductAttention.Config):
        return {"tokens": tokens}
    positions = torch.arange(SEQ).repeat(BATCH, 1)
    return {"tokens": tokens, "positions": positions, "attention_masks": model.get_attention_masks(positions)}


def torchtitan_loss(output, batch):
    """torchtitan's trainer loss, as ``components/loss.py`` writes it for plain tensors (the
    sum of token cross-entropies of float32 logits, ignoring -100) over the number of
    labels; labels are the tokens shifted by one."""
    labels = batch["tokens"][:, 1:]
    pred = output[:, :-1]
    summed = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)
    return summed / labels.numel()


# ---- litgpt --------------------------------------------------------------------------------

def litgpt_config(name: str):
    """``Config.from_name(name)`` with only sizes changed (``hf_tiny.tiny_values``)."""
    from hf_tiny import tiny_values
    from litgpt.config import Config, name_to_config

    # A registry entry names only what differs from the Config defaults (phi-2 has no n_head).
    defaults = {f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING}
    return Config.from_name(name, **tiny_values({**defaults, **name_to_config[name]}))


def build_litgpt(name: str):
    from litgpt.model import GPT

    return GPT(litgpt_config(name))


def litgpt_inputs(model) -> tuple:
    return (torch.randint(0, model.config.vocab_size, (BATCH, SEQ)),)


def litgpt_loss(output, batch):
    """litgpt's pretraining loss: ``chunked_cross_entropy(logits, targets)``, targets the
    tokens shifted by one."""
    from litgpt.utils import chunked_cross_entropy

    return chunked_cross_entropy(output[:, :-1], batch[0][:, 1:])


# ---- model files ---------------------------------------------------------------------------

def model_file_text(source: str, name: str) -> str:
    """A model file that builds the row ``source:name``."""
    head = (f'"""plain_coverage row {source}:{name}."""\nimport sys\n'
            f"sys.path.insert(0, {str(BENCH_DIR)!r})\nsys.path.insert(0, {str(ROOT)!r})\n")
    if source == "nanogpt":
        return head + "from tests.models.nanogpt import build_model, example_inputs  # noqa: F401\n"
    if source not in ("torchtitan", "litgpt"):
        raise ValueError(f"expected a source torchtitan, litgpt or nanogpt, got {source!r}")
    return head + (
        f"import plain_models\n\n_built = []\n\n\n"
        f"def build_model():\n    _built.append(plain_models.build_{source}({name!r}))\n    return _built[-1]\n\n\n"
        f"def example_inputs():\n    return plain_models.{source}_inputs(_built[-1])\n\n\n"
        f"def compute_loss(output, batch):\n    return plain_models.{source}_loss(output, batch)\n"
    )


def class_name(source: str, name: str) -> str:
    return {"torchtitan": "Decoder", "litgpt": "litgpt.GPT", "nanogpt": "GPT"}.get(source, "")


if __name__ == "__main__":  # print the rows and each one's tiny config sizes
    sys.path.insert(0, str(BENCH_DIR))
    for row in registry_rows():
        print(*row)
