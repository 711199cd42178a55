"""Rows of the coverage benchmark whose forced-budget step once ran other collectives than
predicted where DTensor, at run time, made or moved a layout otherwise than the planner's
rules said (``tests/unit/plan/test_runtime_layouts.py`` has the small cases), run as
``tests/integration/coverage_rows/test_coverage_rows.py`` runs its rows:

- SwiftFormer, float32: its attention normalizes the query and key (``F.normalize``), made
  split by channels on tp; DTensor runs the vector norm on the split and leaves each rank
  its share's norm (``placements.runtime_spec``: ``P(2-norm)``), which the division's
  ``clamp_min`` all-reduces, where the prediction had gathered the query for the norm.
- SwiftFormer, bfloat16: its convolution weights, stored split by input channels over dp
  and tp, get their gradients back by DTensor's cheapest path in bytes, which for two-byte
  elements reduce-scatters the whole gradient and slices the dp split
  (``cost/comm._dtensor_steps``), where the prediction priced the float32 path.
- MobileBERT, float32: its word embedding reads its weight as stored (tied to the decoder,
  no hook gathers it), so DTensor gathers the token ids inside the forward; the backward
  runs on the ids as saved and hands the weight a gradient partial on tp
  (``plan/runtime_backward.embedding_backward``), which DTensor adds whole to the decoder's
  (``plan/gradient_rules.summed``, a part split over two axes).
- MobileBERT, bfloat16: its head's hook gathers its ``bias``, and the head adds
  ``self.decoder.bias``, the same parameter under another name, which the engine now
  swaps too (``apply/parameters.gather_parameters_for_use``); before, DTensor gathered it
  again inside the add.
- NeoMME, bfloat16: its model's hook gathers the embedding projection for the projection's
  product and the head's own (``hidden @ self.unembedding_projection.weight``, the same
  weight tied); the two gradients are summed and reduce-scattered once
  (``parameter_uses.hook_calls``), and the projection's hook, finding the weight gathered,
  no longer redistributes it again (whose backward all-reduced its gradient alone).
  (Which buffer NeoMME's rotary embedding reads depends on the hash seed; the row runs
  as predicted either way.)
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("image_classification", "swiftformer", "float32"),
    ("image_classification", "swiftformer", "bfloat16"),
    ("masked_lm", "mobilebert", "float32"),
    ("masked_lm", "mobilebert", "bfloat16"),
    ("masked_lm", "neomme", "bfloat16"),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
