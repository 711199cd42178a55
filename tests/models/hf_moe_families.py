"""HuggingFace mixture-of-experts families, configs as shipped with sizes shrunk (width 32,
two layers, 8 experts of 16 or 4 of 48, top-2): one builder each, the batch shared."""

import torch
import transformers

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def build_deepseek_v3():
    # multi-head latent attention: as many key-value heads as heads
    return _model(transformers.DeepseekV3Config(
        **(SMALL | {"num_key_value_heads": 4}), n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8))


def build_gpt_oss():
    return _model(transformers.GptOssConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                                            layer_types=["full_attention"] * 2))


def build_qwen3_moe():
    return _model(transformers.Qwen3MoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                                              head_dim=8))


def build_olmoe():
    return _model(transformers.OlmoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2))


def _model(config):
    return transformers.AutoModelForCausalLM.from_config(config)


def example_inputs():
    ids = torch.randint(0, SMALL["vocab_size"], (8, 16))
    return {"input_ids": ids, "labels": ids}
