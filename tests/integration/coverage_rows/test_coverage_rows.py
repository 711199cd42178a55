"""Rows of the coverage benchmark (``benchmarks/hf_coverage.py``) whose step once ran other
collectives than the plan predicted, under the benchmark's budget that forces weights to
shard on every mesh axis. Each runs as the benchmark runs it (``hf_row.run_row``): tiny
config as shipped, plans with the default and the forcing budget, one fake-process-group
step each, collectives compared.

- Mixtral, float32: the experts' ``act_fn(gate) * up`` and grouped matrix products hand
  a gradient partial on dp on to their inputs unreduced (``plan/gradient_rules.carries_partial``),
  and the experts' weight gradient comes back whole on tp (``whole_product_gradient``).
- Llama, bfloat16: RMSNorm's weight, gathered for ``weight * x``, is not gathered again
  for the product's backward (``dtensor/saved_inputs.py``: autograd hands the backward an
  alias of the saved parameter).
- BART masked LM, float32: dropout's ``x * mask``, made split on the hidden dim on dp, gets
  its gradient split on tokens there; DTensor runs ``grad * mask`` in the gradient's layout,
  moving the saved mask, and the gradient goes on split on tokens
  (``plan/split_gradients.resplit_through``).
- SmolLM3, bfloat16: RMSNorm upcasts to float32 and casts back; the cast's backward runs on
  a gradient split by hidden as it comes, and carries a partial one on unreduced, as a
  pointwise op's does (``plan/gradient_rules._CASTS``): the split gradient's sum with the
  variance's partial one is reduce-scattered on the float32 side.
- GPT-J, float32: its output head's weight is stored with its hidden dim split over both
  axes, and DTensor reduces the weight's gradient into that storage by a path it picks for
  the tensor's real sizes (``cost/comm._dtensor_steps``).
- OLMoE, float32: its experts' weighted output, partial on tp, is viewed before it is
  reduced; the view hands back a whole gradient (``plan/gradient_rules.through_view``),
  where the prediction had it partial and all-reduced twice.
- Cohere, float32 (both budgets): its layer norm on a hidden dim its embedding split on tp
  makes ``x - mean(x)`` averaged-partial; the whole ``x`` gets a whole gradient from the
  subtraction, and the weight's and ``rsqrt``'s gradients are all-reduced at the
  activation's size before their broadcast sums (``plan/gradient_rules.averaged_*``).
- DeBERTa-v2 masked LM, float32: its attention's ``.contiguous()`` copy hands a partial
  gradient on unreduced, and the view that split the heads copies it back in its
  backward, where DTensor's ``clone`` all-reduces it (``plan/gradient_strides.py``).
- XGLM, float32: its attention scores, made whole on dp, get their gradient split by
  query rows; the batched matrix product's backward runs on it as it comes, the query's
  gradient split and the key's partial (``plan/split_gradients.matmul_split_axes``), and
  a transpose hands the split back on its input's own dim (``through_view``).
- Gemma 2, float32: its softmax reads scores split by key gathered inside the op; the
  gather has no backward, so the whole gradient goes back through the mask's add
  (``plan/gradient_rules.passes_gradient``) unsplit.
- Gemma 2, bfloat16: its rotary embedding's ``cat(-x2, x1)`` hands a partial gradient on
  unreduced (a concatenation's backward slices it; ``carries_partial``).
- Bloom, bfloat16: its attention scores are ``baddbmm(alibi, q, k)``, whose backward runs
  on a split gradient as a batched product's does (``matmul_split_axes``).
- ALBERT masked LM, float32: its one layer runs twice, and each call's module hook brings
  that call's share of the weights' gradient back to their storage (a reduce_scatter
  per call, ``plan/value_gradient.value_gradient``), where the prediction summed the shares
  and settled them once.
- T5, float32: its learned position bias, split by heads on dp, is added to scores split
  by batch on tp: the decomposed attention (a mask that needs a gradient takes no fused
  kernel) splits the scores by heads, and their gradient, reshaped back to
  ``(batch * heads, ...)``, is gathered first (``plan/split_gradients.reshaped_gradient``);
  the mask is not moved to the query's layout beforehand (``dtensor/fused_attention.py``);
  and the attention hands the bias it was given back as its input hook laid it out
  (``plan/builder._call_layout``), where the output hook gathered it.
- M2M100, float32: its encoder and decoder run as opaque regions (their positional
  embedding has data-dependent shapes) and read the shared embedding there; a region
  gathers what it reads itself, so it is not one of the parameter's readers
  (``Plan.parameter_readers``), whose hooks gathered the embedding once more.
- Longformer masked LM, float32 (both budgets): its sliding-window attention runs as an
  opaque region (whether any token attends globally is read from the mask), and its
  chunk count, sizes divided, is a value the fake mode knows (``trace/opaque.py``); its
  output head's product, its input split by rows, gathers the weight inside the op, and
  the backward's product with the saved weight's transpose reuses that gather
  (``dtensor/saved_inputs.py``).
- ConvNeXt, bfloat16: its blocks permute channels-first activations to channels-last and
  back; a gradient gathered between the permutes came back contiguous where its DTensor's
  strides said channels-last, and the backward's view of the shard failed; a moved shard
  is laid out as its DTensor's strides say (``dtensor/local_strides.py``).
- MPT, bfloat16: its fused q/k/v projection is chunked in three; the chunk's backward
  joins the three gradients as they come (the query's split by rows on dp, the key's
  partial there, the value's whole) and DTensor's ``cat`` keeps the split, reduce-scattering
  the key's, where the prediction had each settled where it was made first
  (``plan/runtime_choice.joined_gradient``).
- Qwen2-MoE, float32: its experts' gate-and-up grouped product gets its gradient partial
  on tp with its weight saved split by the contracted dim there; reducing the one and
  gathering the other cost DTensor the same, and it gathers the weight, keeping the
  gradient partial into both backward products (``plan/runtime_backward.grouped_backward_moves``).
- Zamba2, bfloat16: its mamba mixers convolve with ``self.conv1d.weight.squeeze(1)`` and
  take that view once more for nothing; the unread view kept the plan from gathering the
  depthwise filter stored split by channel, and DTensor's convolution ran its local shard
  with the global groups (``plan/builder._uses`` skips an unread view).
- Helium (float32 here; bfloat16 alike): its rotary embedding interleaves, ``stack((-x2, x1), -1)``
  of strided slices; the query's and key's gradients come back from attention split by
  heads on tp where the stack made its output whole, and the stack's backward selects
  along its new dim on the split gradient as it comes (``plan/split_gradients.split_through``),
  where the prediction had it gathered.
- DiffLlama (float32 here; bfloat16 alike): its differential attention repeats each half of the
  value heads (``v.repeat(1, 2, 1, 1)``), and attention hands the repeats' gradients back
  split by heads on dp where the repeat made them whole; the repeat's backward views the
  heads as (repeats, heads) and sums over the repeats on the split gradient as it comes,
  a partial sum (``plan/split_gradients.repeated_split``), which the chunk's join carries
  on and the view's copy all-reduces, where the prediction had each repeat's gradient
  gathered.
- GPT-OSS (float32 here; bfloat16 alike): its experts' gate, ``gate * sigmoid(gate * alpha)`` of
  ``gate.clamp(max=limit)``, gets its gradient partial on dp from the down projection's
  grouped product; ``sigmoid``'s backward (``sigmoid_backward``) and the clamp's (a
  ``where``) are ops DTensor reduces a partial gradient for, where a product carries it
  (``plan/backward_ops.backward_keeps_partial``); the gate and up, sliced apart from one
  projection (``gate_up[..., ::2]``), hand back gradients split by the sliced dim on tp,
  which the slice's backward gathers (torch 2.13) or moves to another dim, split twice there
  (torch 2.14), as DTensor's rule says (``plan/split_gradients.sliced_gradient``); the bias
  picked by expert (``bias[expert_ids]``) gets that gradient in the layout DTensor's
  ``index_put`` reads it in (``plan/runtime_backward.index_backward_read``); and the
  bias, added in place (``add_``), gets the sum's gradient as it is
  (``plan/gradient_rules.passes_gradient``).
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [("causal_lm", "mixtral", "float32"), ("causal_lm", "llama", "bfloat16"), ("masked_lm", "bart", "float32"),
        ("causal_lm", "smollm3", "bfloat16"), ("causal_lm", "gptj", "float32"),
        ("causal_lm", "olmoe", "float32"), ("causal_lm", "cohere", "float32"), ("masked_lm", "deberta-v2", "float32"),
        ("causal_lm", "xglm", "float32"), ("causal_lm", "gemma2", "float32"), ("causal_lm", "gemma2", "bfloat16"),
        ("causal_lm", "bloom", "bfloat16"), ("masked_lm", "albert", "float32"), ("seq2seq_lm", "t5", "float32"),
        ("seq2seq_lm", "m2m_100", "float32"), ("masked_lm", "longformer", "float32"),
        ("image_classification", "convnext", "bfloat16"), ("causal_lm", "mpt", "bfloat16"),
        ("causal_lm", "qwen2_moe", "float32"), ("causal_lm", "zamba2", "bfloat16"), ("causal_lm", "helium", "float32"),
        ("causal_lm", "diffllama", "float32"), ("causal_lm", "gpt_oss", "float32")]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
