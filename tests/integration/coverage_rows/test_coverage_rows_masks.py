"""Rows of the coverage benchmark whose forced-budget step once ran other collectives than
predicted because the trace built an attention mask that the training step skips, run as
``tests/integration/coverage_rows/test_coverage_rows.py`` runs its rows.

With no attention mask in the batch, these models make one of ones and hand it to
transformers' mask functions, which skip a mask that is all ones, but read it only when
not tracing: the trace, on fake tensors, built the mask and added it to every layer's
scores, and the prediction moved it where the step never had it
(``trace/known_values.py`` now lets the trace read the ones, and skip the mask as the step does):

- RoFormer (masked LM), float32: on dp, 14 reduce_scatters predicted where 8 ran.
- TAPAS (masked LM), bfloat16: the same mask, in another encoder.
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("masked_lm", "roformer", "float32"),
    ("masked_lm", "tapas", "bfloat16"),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
