"""The benchmark's config shrinker (benchmarks/hf_tiny.py): sizes shrink, behaviour flags
stay as shipped, nested configs shrink too, and the tiny model builds and runs a step; at
real widths (``few_layers_config``) only the layer counts change."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))  # tests/integration/models/ -> the checkout

from hf_tiny import build_tiny_model, few_layers_config, tiny_config, tiny_inputs

BEHAVIOUR_FLAGS = ("use_cache", "return_dict", "tie_word_embeddings", "_attn_implementation", "_experts_implementation",
                   "output_hidden_states", "hidden_act", "is_encoder_decoder")
CASES = [("causal_lm", "llama"), ("causal_lm", "mixtral"), ("seq2seq_lm", "t5"), ("image_classification", "vit")]


@pytest.mark.parametrize("task,model_type", CASES)
def test_tiny_config_changes_sizes_only(task, model_type):
    from transformers import CONFIG_MAPPING

    shipped, tiny = CONFIG_MAPPING[model_type](), tiny_config(model_type)
    for flag in BEHAVIOUR_FLAGS:
        assert getattr(tiny, flag, None) == getattr(shipped, flag, None), flag
    width = next(getattr(tiny, n) for n in ("hidden_size", "d_model") if hasattr(tiny, n))
    assert width == 64
    layers = next(getattr(tiny, n) for n in ("num_hidden_layers", "num_layers") if hasattr(tiny, n))
    assert layers == 2
    if hasattr(shipped, "vocab_size"):
        assert tiny.vocab_size == 512 < shipped.vocab_size


def test_grouped_query_attention_and_experts_stay_grouped():
    tiny = tiny_config("mixtral")
    assert (tiny.num_attention_heads, tiny.num_key_value_heads) == (4, 2)  # shipped 32 / 8: grouped
    assert (tiny.num_local_experts, tiny.num_experts_per_tok) == (4, 2)
    assert tiny_config("llama").num_key_value_heads == 4  # shipped kv == heads: stays so


def test_nested_configs_shrink():
    tiny = tiny_config("gemma3")
    assert tiny.text_config.hidden_size == 64 and tiny.text_config.num_hidden_layers == 2
    assert tiny.vision_config.hidden_size == 64 and tiny.vision_config.num_hidden_layers == 2
    assert len(tiny.text_config.layer_types) == 2


@pytest.mark.parametrize("task,model_type", [("causal_lm", "llama"), ("seq2seq_lm", "t5"), ("image_classification", "vit")])
def test_tiny_model_runs_a_training_step(task, model_type):
    torch.manual_seed(0)
    model = build_tiny_model(task, model_type)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    loss = model(**tiny_inputs(task, model.config)).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_flat_config_of_another_library_shrinks_by_the_same_table():
    """litgpt's names (plain_coverage.py): widths, grouped kv heads, experts, positions and
    per-layer lists shrink; behaviour (norm, activation, bias) stays; derived sizes stay None."""
    from hf_tiny import tiny_values

    mixtral = dict(name="Mixtral-8x7B-v0.1", block_size=32768, n_layer=32, n_embd=4096, n_head=32, n_query_groups=8,
                   head_size=128, vocab_size=32000, padded_vocab_size=32000, intermediate_size=14336, n_expert=8,
                   n_expert_per_token=2, norm_class_name="RMSNorm", bias=False, mlp_class_name="LLaMAMoE",
                   rope_n_elem=None, sliding_window_indices=[1, 0] * 16)
    tiny = tiny_values(mixtral)
    assert tiny == dict(block_size=128, n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16, vocab_size=512,
                        padded_vocab_size=512, intermediate_size=128, n_expert=4, n_expert_per_token=2,
                        sliding_window_indices=[1, 0])


@pytest.mark.parametrize("model_type", ["mixtral", "t5", "gemma3", "jamba"])
def test_real_widths_change_the_layer_count_only(model_type):
    """``hf_coverage.py --widths real``: every width, head count, vocabulary and expert count
    as shipped; 2 layers, the per-layer lists cut to them (nested configs alike)."""
    from transformers import CONFIG_MAPPING

    shipped, real = CONFIG_MAPPING[model_type](), few_layers_config(model_type)
    for config, cut in ((shipped, real), *((getattr(shipped, n), getattr(real, n)) for n in ("text_config", "vision_config")
                                           if hasattr(shipped, n))):
        after = cut.to_dict()
        for name, value in config.to_dict().items():
            if name in ("num_hidden_layers", "num_layers", "layer_types", "attn_layer_offset", "attn_layer_period",
                        "expert_layer_offset", "expert_layer_period", "num_decoder_layers"):
                continue
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                assert after[name] == value, name
        knob = next((n for n in ("num_hidden_layers", "num_layers") if n in after), None)
        if knob is None:  # a composite config (Gemma 3): its text and vision configs have the layers
            continue
        assert after[knob] == min(2, getattr(config, knob))
        if getattr(config, "layer_types", None):
            assert len(cut.layer_types) == after[knob]


def test_batch_shape_of_the_inputs():
    text, image = tiny_inputs("causal_lm", tiny_config("llama"), batch=4, seq=64), tiny_inputs(
        "image_classification", tiny_config("vit"), batch=6, seq=15)
    assert text["input_ids"].shape == text["labels"].shape == (4, 64)
    assert image["pixel_values"].shape[0] == image["labels"].shape[0] == 6  # the images keep their size
