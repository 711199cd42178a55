"""HuggingFace models with their configs as shipped: only the sizes changed.

Every other field keeps its default, as a user writes it: the key/value cache on
(``use_cache=True``), ``return_dict`` on, transformers' default attention (``sdpa``) and,
for Mixtral, its default experts implementation (``grouped_mm``). T5 sets
``decoder_start_token_id`` as every shipped T5 checkpoint's config does (without it T5
cannot shift its labels into decoder inputs, on any device).
"""

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    ConvBertConfig,
    ConvBertForMaskedLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    FalconConfig,
    FalconForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    GraniteMoeConfig,
    GraniteMoeForCausalLM,
    JetMoeConfig,
    JetMoeForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OpenAIGPTConfig,
    OpenAIGPTLMHeadModel,
    PhiConfig,
    PhiForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    XLMConfig,
    XLMWithLMHeadModel,
    XLNetConfig,
    XLNetLMHeadModel,
)

VOCAB, BATCH, SEQ = 256, 8, 16
_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def llama():
    return LlamaForCausalLM(LlamaConfig(**_DECODER, num_key_value_heads=2))


def qwen2():
    return Qwen2ForCausalLM(Qwen2Config(**_DECODER, num_key_value_heads=2))


def mixtral():
    return MixtralForCausalLM(MixtralConfig(**_DECODER, num_key_value_heads=2, num_local_experts=4))


def gpt_neox():
    return GPTNeoXForCausalLM(GPTNeoXConfig(**_DECODER))


def phi():
    return PhiForCausalLM(PhiConfig(**_DECODER))


def t5():
    config = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config)


def bart():
    config = BartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
    )
    return BartForConditionalGeneration(config)


def deepseek_v3():
    # Multi-head latent attention: query and key heads of 16 + 8 (no rope + rope), values of 16.
    config = DeepseekV3Config(
        **_DECODER, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    )
    return DeepseekV3ForCausalLM(config)


def falcon():
    # Multi-query attention: one fused q/k/v projection of num_heads + 2 heads.
    config = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    return FalconForCausalLM(config)


def granitemoe():
    # Its causal LM's forward passes **kwargs on; the inner model reads use_cache from the config.
    return GraniteMoeForCausalLM(GraniteMoeConfig(**_DECODER, num_key_value_heads=2, num_local_experts=4))


def jetmoe():
    # Mixture of attention heads and of MLP experts; each experts' module splits the routed
    # tokens by counts the router reads on the host (expert_size.tolist()).
    config = JetMoeConfig(**_DECODER, num_key_value_heads=2, num_local_experts=4)
    return JetMoeForCausalLM(config)


def convbert():
    # Its span-based dynamic convolution gathers each token's neighbours with F.unfold.
    config = ConvBertConfig(
        vocab_size=VOCAB, hidden_size=64, embedding_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64,
    )
    return ConvBertForMaskedLM(config)


def openai_gpt():
    # Its MLPs take their activation from a module-level dict of module instances.
    return OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64))


def xlm():
    # Its encoder builds a key/value cache whatever the config says, and asserts on a value
    # read from the batch (the longest sequence), which makes it an opaque region.
    return XLMWithLMHeadModel(XLMConfig(vocab_size=VOCAB, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64))


def xlnet():
    # Its attention weights are made with torch.FloatTensor(...), on the CPU whatever the default device.
    return XLNetLMHeadModel(XLNetConfig(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, d_inner=128, d_head=16))


def example_inputs():
    # Labels are drawn separately: the batch's tensors must not alias each other.
    return dict(
        input_ids=torch.randint(0, VOCAB, (BATCH, SEQ)),
        labels=torch.randint(0, VOCAB, (BATCH, SEQ)),
    )
