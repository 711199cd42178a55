"""Rows of the coverage benchmark whose forced-budget step once ran other collectives than
predicted in the backward of a matrix product (experts' grouped and batched products, and
attention scores), run as ``tests/integration/coverage_rows/test_coverage_rows.py`` runs its rows:

- Zaya, float32: its experts (transformers' grouped form) read both weights split by the
  contracted dim on tp. The down projection gathers its weight inside the forward
  product, and its backward, asked of DTensor with the weight as saved, hands
  ``act(gate) * up`` a gradient split by that dim (``plan/runtime_backward.product_backward``);
  that product, made partial on tp, gets its gradient in another layout than it made, and
  DTensor, asked (``plan/runtime_backward.elementwise_backward``), reduce-scatters the saved
  ``up`` for ``act(gate)``'s gradient, where the prediction had all-reduced a partial
  gradient at the activation. Its key residual, a mean over query heads, runs its
  backward on a gradient split by batch on tp as it comes
  (``plan/split_gradients.split_through``), where the prediction gathered it.
- Beam, bfloat16: the same experts cast ``act(gate) * up``, partial on tp, before the down
  projection; the cast's backward runs on the split gradient as it comes too.
- Llama 4, float32: its experts, a ``bmm`` per expert, get their gradients in other
  layouts than their products made: DTensor picks, for each backward product, whether
  to move the gradient or the saved operand (``plan/runtime_backward.runs_product_backward``,
  ``runs_elementwise_backward``), where the prediction had moved each gradient to the
  layout its product made.
- XLNet, float32: its attention adds a learned bias per head to the query, which comes
  partial on tp from its projection; DTensor makes the bias partial for the add, and the
  scores' batched product reduces the keys, saved partial, inside the op. The query's
  gradient, a product with the keys as saved, comes back partial
  (``plan/runtime_backward.product_backward``, batched products too); the add hands it to
  the query as it comes and sums it for the bias, partial, where the bias's gradient is
  all-reduced (``plan/gradient_rules.passes_gradient_to``, ``carries_partial``), where the
  prediction had the add's backward run split on dp and reduce on tp.
- DeBERTa, float32: its layer norm, written out (``(x - mean) / sqrt(var + eps)``, then
  ``weight * y + bias``), runs on the hidden dim split on dp; DTensor gathers ``x`` for the
  subtraction and keeps the quotient partial. The gradient comes back split, so DTensor is
  asked the backward of the weight's product, a broadcast operand's (``grad * weight``
  split as the gradient comes; the weight's ``grad * y`` summed over batch and tokens, an
  all-reduce), and of the quotient, whose denominator's gradient ``-grad * ((a / b) / b)``
  reduce-scatters the partial quotient (``plan/runtime_backward.elementwise_backward``),
  where the prediction had the gradient whole there and missed that reduce-scatter.
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("causal_lm", "zaya", "float32"),
    ("causal_lm", "beam", "bfloat16"),
    ("causal_lm", "llama4_text", "float32"),
    ("causal_lm", "xlnet", "float32"),
    ("masked_lm", "deberta", "float32"),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
