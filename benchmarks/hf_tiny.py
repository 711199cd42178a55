"""Tiny HuggingFace models, as shipped except for their sizes, for ``hf_coverage.py``.

``tiny_config(model_type)`` takes the config class's shipped defaults (``ConfigClass()``) and
changes only sizes, by attribute name, with one table for every architecture. Behaviour
flags (``use_cache``, ``return_dict``, ``attn_implementation``, ``experts_implementation``,
``tie_word_embeddings``, dropout, ...) are left alone: a model is planned the way its config
ships. Nested configs (``text_config``, ``vision_config``, ``encoder``, ...) are shrunk the same
way, recursively. A knob is touched only where the shipped config has it.

=====================================  ==================================================
attribute(s)                           tiny value
=====================================  ==================================================
hidden_size, d_model, n_embd, dim,     64
hidden_dim, emb_dim, word_embed_proj_
dim, pooler_output_size
embed_dim, embedding_size, input/      32 (also a hierarchical vision model's first stage)
output_embedding_size, entity_emb_size
intermediate_size, ffn_dim, d_ff,      128
d_inner, dim_ff, mlp_dim, n_inner,
ffn_hidden_size, *_intermediate_size,
*_ffn_dim
num_hidden_layers, num_layers,         2; per-layer lists (``layer_types``) and dicts keyed
n_layer(s), encoder/decoder_layers,    by layer (``per_layer_config``, its sizes shrunk too)
num_decoder_layers                     keep layer 0 and the layer adding most kinds of
                                       layer not yet kept (a hybrid's attention layer)
*_layer_offset, *_layer_period         at most 1, at most 2 (Jamba's attention / MoE layers)
num_kv_shared_layers                   0 (2 layers leave none of each kind to borrow from)
num_attention_heads, num_heads,        4 (a list of per-stage heads: 1, 2, 4, ...)
n_head(s), encoder/decoder_attention_
heads
num_key_value_heads, num_kv_heads,     2 where the shipped config groups queries (kv < heads),
n_kv_heads, multi_query_group_num,     1 where it has one kv head, 4 where kv == heads
n_query_groups (litgpt)
head_dim, head_size, d_kv, *_head_dim, 16 (= 64 / 4 heads; None stays None)
kv_lora_rank, q_lora_rank,
hidden_size_per_layer_input
rotary_dim                             at most 8 (GPT-J, CodeGen: part of a 16-wide head)
vocab_size, *vocab_size                512 or just above the largest special token id,
                                       never more than shipped (type_vocab_size stays 2)
max_position_embeddings, n_positions,  at most 128 (the batch is 16 tokens long)
n_ctx, max_seq_len, block_size
num_local_experts, num_experts,        at most 4
n_routed_experts, moe_num_experts,
n_expert
num_experts_per_tok(en), moe_topk,     at most 2
moe_top_k, moe_k, n_expert_per_token
n_group, topk_group, num_expert_group, at most 1 (4 experts make one group; one of the 2
first_k_dense_replace, num_dense_      layers stays MoE)
layers, (n|num|moe_num)_shared_experts,
n_shared_expert, n_(expert|topk)_groups
image_size                             32;  patch_size 2;  window_size 2 (Swin's last stage
                                       then spans one window, as it ships at 224 / 4 / 7)
hidden_sizes (per stage)               16, 32, 64, ... (one per stage, stages kept)
depths (per stage)                     1 each
decoder_start_token_id                 pad_token_id where an encoder-decoder config lacks it
                                       (a token id, not a size: T5's config ships without it,
                                       its checkpoints carry it; without it no step runs)
=====================================  ==================================================

The litgpt names (``n_query_groups``, ``head_size``, ``block_size``, ``n_expert``, ...) serve
``plain_models.py``, which shrinks litgpt's flat configs with ``tiny_values``.

Sizes a config derives from others (llama's ``head_dim``) are recomputed by the config
class itself: only the knobs above are passed to it.

``build_tiny_model(task, model_type)`` builds the task's auto model from that config and
``tiny_inputs(task, config)`` one global batch: token ids and labels (batch 8, 16 tokens)
for language models (a seq2seq model makes its decoder inputs from the labels), pixel
values and class labels for image classification.
"""

from __future__ import annotations

import torch

TASKS = {
    "causal_lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked_lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq_lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "image_classification": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
}
BATCH, SEQ = 8, 16
WIDTH, FFN, LAYERS, HEADS, HEAD_DIM, EMBED, VOCAB = 64, 128, 2, 4, 16, 32, 512
MAX_POSITIONS, EXPERTS, TOP_K, IMAGE, PATCH, WINDOW = 128, 4, 2, 32, 2, 2

WIDTH_KNOBS = ("hidden_size", "d_model", "n_embd", "dim", "hidden_dim", "emb_dim", "word_embed_proj_dim",
               "pooler_output_size")
EMBED_KNOBS = ("embed_dim", "embedding_size", "input_embedding_size", "output_embedding_size", "entity_emb_size")
FFN_KNOBS = ("intermediate_size", "ffn_dim", "d_ff", "d_inner", "dim_ff", "mlp_dim", "n_inner", "ffn_hidden_size",
             "expert_ffn_hidden_size", "intermediate_size_mlp")
FFN_SUFFIXES = ("_intermediate_size", "_ffn_dim")
LAYER_KNOBS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
               "num_decoder_layers")
HEAD_KNOBS = ("num_attention_heads", "num_heads", "n_head", "n_heads", "encoder_attention_heads",
              "decoder_attention_heads")
KV_HEAD_KNOBS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_query_groups")
POSITION_KNOBS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "block_size")
EXPERT_KNOBS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "n_expert")
TOP_K_KNOBS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k", "n_expert_per_token")
AT_MOST_ONE = ("n_group", "topk_group", "num_expert_group", "first_k_dense_replace", "num_dense_layers",
               "n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "n_shared_expert",
               "n_expert_groups", "n_topk_groups")
"""Expert groups (4 experts make one), dense layers before the first MoE layer (one of the
2 layers stays MoE), shared experts."""


def tiny_config(model_type: str):
    """The shipped config of ``model_type`` with only its sizes made tiny (table above)."""
    from transformers import CONFIG_MAPPING

    shipped = CONFIG_MAPPING[model_type]()
    return type(shipped)(**tiny_overrides(shipped))


def few_layers_config(model_type: str):
    """The shipped config of ``model_type`` at its real widths, cut to ``LAYERS`` layers:
    only the layer counts change (and what follows them: per-layer lists cut to the layers
    kept, the knobs that place layers of a kind among them, ``LAYER_PLACING``), nested
    configs alike. Hidden sizes, heads, vocabulary, experts and image sizes are as shipped."""
    from transformers import CONFIG_MAPPING

    shipped = CONFIG_MAPPING[model_type]()
    return type(shipped)(**few_layers_overrides(shipped))


LAYER_PLACING = ("num_kv_shared_layers", "first_k_dense_replace", "num_dense_layers")
"""Knobs of ``few_layers_config`` beside the layer counts, that say where the layers of a
kind are (and ``*_layer_offset``, ``*_layer_period``): with 2 layers left, as in ``tiny_config``."""


def few_layers_overrides(config) -> dict:
    """Keyword arguments that rebuild ``config`` with ``LAYERS`` layers; nested configs as dicts."""
    values = config.to_dict()
    out = {name: value for name, value in tiny_values(values).items() if _places_layers(name, values[name])}
    if values.get("is_encoder_decoder") and values.get("decoder_start_token_id") is None and _is_int(values.get("pad_token_id")):
        out["decoder_start_token_id"] = values["pad_token_id"]
    for name in _sub_config_names(config):
        sub = getattr(config, name)
        out[name] = {**sub.to_dict(), **few_layers_overrides(sub)}
    return out


def _places_layers(name: str, shipped) -> bool:
    """Whether ``few_layers_config`` changes this knob: a layer count, a ``LAYER_PLACING``
    knob, or a per-layer list or dict (cut to the layers kept), but no per-stage size list."""
    if name in LAYER_KNOBS or name in LAYER_PLACING or name.endswith(("_layer_offset", "_layer_period")):
        return True
    return not _is_int(shipped) and not name.endswith(_LIST_SIZES)


_LIST_SIZES = ("hidden_sizes", "image_size", "patch_size", *HEAD_KNOBS)
"""Lists ``tiny_values`` shrinks as sizes (per stage), not as one entry per layer."""


def tiny_overrides(config) -> dict:
    """Keyword arguments that rebuild ``config`` with tiny sizes; nested configs as dicts."""
    values = config.to_dict()
    out = tiny_values(values)
    if values.get("is_encoder_decoder") and values.get("decoder_start_token_id") is None and _is_int(values.get("pad_token_id")):
        out["decoder_start_token_id"] = values["pad_token_id"]
    for name in _sub_config_names(config):
        sub = getattr(config, name)
        out[name] = {**sub.to_dict(), **tiny_overrides(sub)}
    return out


def tiny_values(values: dict) -> dict:
    """The changed entries of a flat ``{attribute: value}`` config (the table above), per-layer
    lists cut to the layers kept: any library's config, not only transformers'."""
    out: dict = {}
    for name, value in values.items():
        tiny = _tiny_value(name, value, values)
        if tiny is not _KEEP:
            out[name] = tiny
    _cut_per_layer_lists(values, out)
    return out


_KEEP = object()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tiny_value(name: str, value, values: dict):
    """The tiny value of one attribute, or ``_KEEP``."""
    if isinstance(value, list):
        return _tiny_list(name, value)
    if not _is_int(value):
        return _KEEP
    if name in WIDTH_KNOBS:
        return WIDTH
    if name in EMBED_KNOBS:
        return EMBED
    if name in FFN_KNOBS or name.endswith(FFN_SUFFIXES):
        return FFN
    if name in LAYER_KNOBS:
        return min(value, LAYERS)
    if name in HEAD_KNOBS:
        return HEADS
    if name in KV_HEAD_KNOBS:
        heads = next((values[h] for h in HEAD_KNOBS if _is_int(values.get(h))), value)
        return 1 if value == 1 else HEADS if value >= heads else HEADS // 2
    if name in ("head_dim", "head_size", "d_kv", "kv_lora_rank", "q_lora_rank") or name.endswith("_head_dim"):
        return HEAD_DIM
    if name == "rotary_dim":  # GPT-J and CodeGen rotate part of each head
        return min(value, HEAD_DIM // 2)
    if name == "hidden_size_per_layer_input":
        return HEAD_DIM
    if name.endswith("vocab_size"):  # never grown: type_vocab_size stays 2
        return min(value, max(VOCAB, _largest_token_id(values) + 1))
    if name in POSITION_KNOBS:
        return min(value, MAX_POSITIONS)
    if name in EXPERT_KNOBS:
        return min(value, EXPERTS)
    if name in TOP_K_KNOBS:
        return min(value, TOP_K)
    if name in AT_MOST_ONE:
        return min(value, 1)
    if name == "num_kv_shared_layers":  # 2 layers leave no layer of each kind to borrow from
        return 0
    if name.endswith("_layer_offset"):  # Jamba: attention / MoE every period-th layer from offset
        return min(value, LAYERS - 1)
    if name.endswith("_layer_period"):
        return min(value, LAYERS)
    if name == "image_size":
        return IMAGE
    if name == "patch_size":
        return PATCH
    if name == "window_size":
        return WINDOW
    return _KEEP


def _tiny_list(name: str, value: list):
    if not value or not all(_is_int(v) for v in value):
        return _KEEP
    if name == "hidden_sizes":
        return [16 * 2**i for i in range(len(value))]
    if name == "depths":
        return [1] * len(value)
    if name in HEAD_KNOBS:
        return [2**i for i in range(len(value))]
    if name in ("image_size", "patch_size"):
        return [IMAGE if name == "image_size" else PATCH] * len(value)
    return _KEEP


def _cut_per_layer_lists(values: dict, out: dict) -> None:
    """Lists with one entry per layer (``layer_types``, ...) and dicts keyed by layer index
    (``per_layer_config``) keep only the layers that remain (``_kept_layers``)."""
    for knob in LAYER_KNOBS:
        before, after = values.get(knob), out.get(knob)
        if not (_is_int(before) and _is_int(after)) or after >= before:
            continue
        kept = _kept_layers(values, before, after)
        for name, value in values.items():
            if name in out:
                continue
            if isinstance(value, list) and len(value) == before:
                out[name] = [value[i] for i in kept]
            elif _is_per_layer_dict(value, before):
                out[name] = _cut_per_layer_dict(value, kept, values)


def _kept_layers(values: dict, before: int, after: int) -> list[int]:
    """Layer 0, then greedily the layer that adds the most kinds not yet kept, over every
    per-layer list of kinds (``layer_types``, ``mlp_layer_types``: a hybrid's attention
    layer among linear ones, a MoE layer after dense ones); the earliest on ties."""
    kinds = [value for value in values.values()
             if isinstance(value, list) and len(value) == before and all(isinstance(v, str) for v in value)]

    def covered(layers):
        return {(n, kind[i]) for n, kind in enumerate(kinds) for i in layers}

    kept = [0]
    while len(kept) < after:
        have = covered(kept)
        gains = [(len(covered([i]) - have), -i) for i in range(before) if i not in kept]
        kept.append(-max(gains)[1])
    return sorted(kept)


def _is_per_layer_dict(value, layers: int) -> bool:
    return (
        isinstance(value, dict) and bool(value)
        and all(str(k).isdigit() and int(k) < layers and isinstance(v, dict) for k, v in value.items())
    )


def _cut_per_layer_dict(value: dict, kept: list[int], values: dict) -> dict:
    """Entries of kept layers, renumbered, their sizes made tiny too."""
    width = len(next(iter(value))) if all(isinstance(k, str) for k in value) else 0
    out = {}
    for new, old in enumerate(kept):
        entry = value.get(str(old).zfill(width)) if width else value.get(old)
        if entry is not None:
            tiny = {k: _tiny_value(k, v, values) for k, v in entry.items()}
            out[str(new).zfill(width) if width else new] = {k: entry[k] if t is _KEEP else t for k, t in tiny.items()}
    return out


def _largest_token_id(values: dict) -> int:
    ids = []
    for name, value in values.items():
        if name.endswith("_token_id"):
            ids += [v for v in (value if isinstance(value, list) else [value]) if _is_int(v)]
    return max(ids, default=0)


def _sub_config_names(config) -> list[str]:
    from transformers import PreTrainedConfig

    return [name for name, value in vars(config).items() if isinstance(value, PreTrainedConfig)]


def model_class_name(task: str, model_type: str) -> str:
    """The class the task's auto registry names for ``model_type`` (the first, where it names several)."""
    from transformers.models.auto import modeling_auto

    names = getattr(modeling_auto, TASKS[task][0])[model_type]
    return names if isinstance(names, str) else names[0]


def build_tiny_model(task: str, model_type: str, dtype: torch.dtype = torch.float32, config=None):
    """The task's model for ``model_type``, tiny (or from ``config``), on the current default device."""
    import transformers

    model_class = getattr(transformers, model_class_name(task, model_type))
    model = model_class(config if config is not None else tiny_config(model_type))
    return model.to(dtype) if dtype != torch.float32 else model


def tiny_inputs(task: str, config, dtype: torch.dtype = torch.float32, batch: int = BATCH, seq: int = SEQ) -> dict:
    """One global batch for ``task`` of ``batch`` examples (``seq`` tokens each for language
    models; an image task's images keep the config's size); floating inputs in ``dtype``,
    integer ones as they are. Labels are drawn separately: the batch's tensors must not
    alias each other."""
    if task == "image_classification":
        vision = _vision_config(config)
        size = _first(getattr(vision, "image_size", IMAGE))
        channels = getattr(vision, "num_channels", 3)
        return dict(
            pixel_values=torch.randn(batch, channels, size, size).to(dtype),
            labels=torch.randint(0, config.num_labels, (batch,)),
        )
    vocab = min(config.get_text_config().vocab_size, VOCAB)
    return dict(input_ids=torch.randint(0, vocab, (batch, seq)), labels=torch.randint(0, vocab, (batch, seq)))


def _vision_config(config):
    sub = getattr(config, "vision_config", None)
    return sub if sub is not None and hasattr(sub, "image_size") else config


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value
