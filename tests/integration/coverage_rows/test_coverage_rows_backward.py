"""More rows of the coverage benchmark whose forced-budget step once ran other collectives
than predicted, run as ``tests/integration/coverage_rows/test_coverage_rows.py`` runs its rows (a file of their own,
so that the test workers share the rows out). All went wrong in the backward:

- Segformer, float32: its MLP's output projection reads its weight gathered on tp inside
  the product (below autograd, so autograd saved it split), and the product's backward,
  asked of DTensor with the weight as saved, gathers the smaller gradient instead
  (``plan/runtime_backward.product_backward``); its drop path, a pointwise product run on a
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
- ESMC, float32: its rotary embedding runs split by sequence on tp (``q * cos``,
  ``cat((-q2, q1), -1)``) and its attention reads the query split by heads, so the
  query's gradient comes back split by heads. ``q * cos`` saved ``cos`` whole (DTensor
  sliced it below autograd) and the ``cat``'s backward reads nothing saved, so DTensor runs
  both backwards on the gradient as it comes (``plan/split_gradients.resplit_through``,
  ``split_through``) and moves it once, at the query norm's backward; the prediction had
  it moved back to the sequence split at each of them.
- LED, float32: its encoder pads the embedded tokens to the attention window with a
  ``cat`` on the sequence dim, whose gradient comes back split by tokens on dp; the cat's
  backward narrows it once per part, and DTensor gathers it for each narrow
  (``plan/gradient_rules.gradient_reads``), where the prediction had one gather.
- Kimi Linear, bfloat16: its gated output norm computes in float32, ``sigmoid`` of its
  gate (made split by heads on tp) read split by tokens by the product after it. The
  gradient comes back split by tokens, and DTensor runs ``sigmoid_backward`` there, the
  saved result moved as the forward moved it (a move kept), so the gradient goes on split
  by tokens through the cast and is moved back at the gate projection's output hook, in
  bfloat16 (``plan/runtime_backward.saved_value_backward``), where the prediction had moved
  it in float32 at the sigmoid.
- PVT, float32: each stage resizes its position embeddings to the patch grid
  (``interpolate``, bilinear); their gradient comes back partial on tp, and DTensor runs
  the interpolation's backward on it as it comes, so the parameter's hook reduce-scatters
  it (``plan/gradient_rules._RESAMPLES``), where the prediction all-reduced it at the
  interpolation.
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("image_classification", "segformer", "float32"),
    ("causal_lm", "rwkv", "float32"),
    ("causal_lm", "minicpm3", "bfloat16"),
    ("causal_lm", "doge", "bfloat16"),
    ("masked_lm", "esmc", "float32"),
    ("seq2seq_lm", "led", "float32"),
    ("causal_lm", "kimi_linear", "bfloat16"),
    ("image_classification", "pvt", "float32"),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
