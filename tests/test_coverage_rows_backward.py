"""More rows of the coverage benchmark whose forced-budget step once ran other collectives
than predicted, run as ``tests/test_coverage_rows.py`` runs its rows (a file of their own,
so that the test workers share the rows out). All went wrong in the backward:

- Segformer, float32: its MLP's output projection reads its weight gathered on tp inside
  the product (below autograd, so autograd saved it split), and the product's backward,
  asked of DTensor with the weight as saved, gathers the smaller gradient instead
  (``plan/runtime_choice.product_backward``); its drop path, a pointwise product run on a
  gradient split by channels on tp as it comes, runs on it whole on dp where it came whole
  (``plan/split_gradients.split_input_gradient``), where the prediction had the gradient
  split on that dim on both axes, a layout that takes a gather on tp first.
- RWKV, float32: its recurrence writes each step's output in place into a zero tensor
  (``out[:, t] = x``), so the value projection leads to the loss only through the writes
  (``plan/reached.reached_by_backward``); its time-mix weights, stored split twice on
  one dim and read both by a product and by ``1 - w``, have no one layout a hook could
  gather them to, so they arrive at each op as stored and DTensor gathers only what each
  op needs (``plan/parameter_uses.gathered_parameters``); and ``1 - w``'s backward, which
  reads nothing saved, carries the partial gradient on unreduced
  (``plan/gradient_rules.partial_axes``).
- MiniCPM3, bfloat16: its residual branch is scaled (``down_proj(...) * scale``), made
  split by batch on dp; its gradient comes back split by hidden there, and the product
  with a number, reading nothing saved, runs on it as it comes
  (``plan/split_gradients.split_through``), where the prediction moved it to the batch
  split first (a gather on tp on DTensor's way).
- Doge, bfloat16: its rotary embedding's ``cat(-x2, x1)`` gets the query's and key's
  gradients split by head dim on dp; the concatenation's backward slices each half out
  of it, and each slice gathers it (``plan/gradient_rules.gradient_reads``), where the
  prediction gathered it once.
- GraniteMoE-SWA, bfloat16: its attention returns its weights, which DTensor made whole on
  dp where the plan lays them out split, but only the attention's own product reads them:
  no gradient comes back through the output hook's split, so nothing gathers it
  (``plan/collectives.py``, the output hooks' backward); and its sinks take the scores'
  ``logsumexp``, whose backward runs on a gradient split by heads as it comes
  (``plan/split_gradients.split_through``).
- ESMC, float32: its rotary embedding runs split by sequence on tp (``q * cos``,
  ``cat((-q2, q1), -1)``) and its attention reads the query split by heads, so the
  query's gradient comes back split by heads. ``q * cos`` saved ``cos`` whole (DTensor
  sliced it below autograd) and the ``cat``'s backward reads nothing saved, so DTensor runs
  both backwards on the gradient as it comes (``plan/split_gradients.resplit_through``,
  ``split_through``) and moves it once, at the query norm's backward; the prediction had
  it moved back to the sequence split at each of them.
- Zaya, float32: its experts (transformers' grouped form) read both weights split by the
  contracted dim on tp. The down projection gathers its weight inside the forward
  product, and its backward, asked of DTensor with the weight as saved, hands
  ``act(gate) * up`` a gradient split by that dim (``plan/runtime_choice.product_backward``);
  that product, made partial on tp, gets its gradient in another layout than it made, and
  DTensor, asked (``plan/runtime_choice.elementwise_backward``), reduce-scatters the saved
  ``up`` for ``act(gate)``'s gradient, where the prediction had all-reduced a partial
  gradient at the activation. Its key residual, a mean over query heads, runs its
  backward on a gradient split by batch on tp as it comes
  (``plan/split_gradients.split_through``), where the prediction gathered it.
- Beam, bfloat16: the same experts cast ``act(gate) * up``, partial on tp, before the down
  projection; the cast's backward runs on the split gradient as it comes too.
- Llama 4, float32: its experts, a ``bmm`` per expert, get their gradients in other
  layouts than their products made: DTensor picks, for each backward product, whether
  to move the gradient or the saved operand (``plan/runtime_choice.runs_product_backward``,
  ``runs_elementwise_backward``), where the prediction had moved each gradient to the
  layout its product made.
- LED, float32: its encoder pads the embedded tokens to the attention window with a
  ``cat`` on the sequence dim, whose gradient comes back split by tokens on dp; the cat's
  backward narrows it once per part, and DTensor gathers it for each narrow
  (``plan/gradient_rules.gradient_reads``), where the prediction had one gather.
- XLNet, float32: its attention adds a learned bias per head to the query, which comes
  partial on tp from its projection; DTensor makes the bias partial for the add, and the
  scores' batched product reduces the keys, saved partial, inside the op. The query's
  gradient, a product with the keys as saved, comes back partial
  (``plan/runtime_choice.product_backward``, batched products too); the add hands it to
  the query as it comes and sums it for the bias, partial, where the bias's gradient is
  all-reduced (``plan/gradient_rules.passes_gradient_to``, ``carries_partial``), where the
  prediction had the add's backward run split on dp and reduce on tp.
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

    ("image_classification", "segformer", "float32"),
    ("causal_lm", "rwkv", "float32"),
    ("causal_lm", "minicpm3", "bfloat16"),
    ("causal_lm", "doge", "bfloat16"),
    ("causal_lm", "granitemoe_swa", "bfloat16"),
    ("masked_lm", "esmc", "float32"),
    ("causal_lm", "zaya", "float32"),
    ("causal_lm", "beam", "bfloat16"),
    ("causal_lm", "llama4_text", "float32"),
    ("seq2seq_lm", "led", "float32"),
    ("causal_lm", "xlnet", "float32"),


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
