"""A row of the coverage benchmark whose forced-budget step once ran other collectives than
predicted where autograd sums a value's gradient parts, run as ``tests/integration/coverage_rows/test_coverage_rows.py``
runs its rows (a file of its own: the row plans for over a minute):

- DeepSeek V4, bfloat16: a value of the second layer is read once by the layer and twice
  by its attention hyper-connection; the layer's part of the gradient comes split by one
  dim on dp, the two hyper-connection parts by another. Both ways of adding
  them cost DTensor the same move, and its add moves the first part (the running sum) to
  the others' split once, where the prediction kept the sum's split and moved each of the
  two parts (``plan/gradient_rules.summed``, asking ``plan/runtime_choice.added_gradients``).
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives


@pytest.mark.slow  # plans the model three times
def test_deepseek_v4_bf16_forced_budget_row_runs_the_predicted_collectives(tmp_path):
    assert_row_runs_the_predicted_collectives(tmp_path, "causal_lm", "deepseek_v4", "bfloat16")
