"""HuggingFace mixture-of-experts models, configs as shipped with sizes shrunk: every one's
experts module is found by ``plan/expert_parallel.find_experts``'s general rule (routed call)."""

import pytest
import transformers

from autoplan.plan.expert_parallel import ROUTED, find_experts

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "MixtralConfig": dict(num_local_experts=4, num_experts_per_tok=2),
    "Qwen3MoeConfig": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8),
    "OlmoeConfig": dict(num_experts=8, num_experts_per_tok=2),
    "GptOssConfig": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, layer_types=["full_attention"] * 2),
    "DeepseekV3Config": dict(n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2, moe_intermediate_size=16,
                             first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                             v_head_dim=8, qk_nope_head_dim=8),
}


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_the_experts_of_each_moe_family_are_found(config_name):
    config = getattr(transformers, config_name)(**SMALL, **CONFIGS[config_name])
    model = transformers.AutoModelForCausalLM.from_config(config)
    found = find_experts(model)
    moe_layers = 1 if config_name == "DeepseekV3Config" else 2  # DeepSeek-V3's first layer is dense
    assert len(found) == moe_layers, found
    assert {e.call for e in found} == {ROUTED}
    experts = {e.experts for e in found}
    assert experts == {CONFIGS[config_name].get("num_local_experts") or CONFIGS[config_name].get("num_experts")
                       or CONFIGS[config_name]["n_routed_experts"]}
