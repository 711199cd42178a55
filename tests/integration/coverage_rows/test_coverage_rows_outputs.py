"""Rows of the coverage benchmark whose forced-budget step once ran other collectives than
predicted because of a module's output hook, run as ``tests/integration/coverage_rows/test_coverage_rows.py`` runs
its rows:

- Switch Transformers, float32: the first layer's attention returns its attention weights,
  which the plan lays out split by query rows on dp, while DTensor's softmax runs on the
  whole scores it gets. The output hook moves a copy to the plan's layout after the
  module's forward; the value product inside the module read the weights as DTensor made
  them (``plan/collectives.step_collectives``: ``made`` for a reader inside the module
  that returns the value), and nothing reads the moved copy, so its backward gathers
  nothing, where the prediction had the value product split and its output gathered for
  the output projection, forward and backward.
- GraniteMoE-SWA, bfloat16: its attention returns its weights, which DTensor made whole on
  dp where the plan lays them out split, but only the attention's own product reads them:
  no gradient comes back through the output hook's split, so nothing gathers it
  (``plan/collectives.py``, the output hooks' backward); and its sinks take the scores'
  ``logsumexp``, whose backward runs on a gradient split by heads as it comes
  (``plan/split_gradients.split_through``).
- GPT-Neo, float32: its embedding dropout, of probability zero, returns the tensor it was
  given, and its output hook moves that to the layout the plan gives the dropout's
  output; the move is charged where the value was made, as before the output hooks were
  predicted for every layout the plan gives an output (a value a module hands back is
  not one it made).
- Gemma 3n, bfloat16: each decoder layer returns its AltUp stack, which DTensor makes
  split by tokens on dp and whole on tp, and whose output hook moves it to whole on dp
  and split by tokens on tp; the layer's own ops read the stack too. The hook's backward
  brings the next layer's gradient back to the layout DTensor made, and autograd adds the
  layer's own readers' parts to that as they come: nothing settles the sum in the plan's
  layout (``plan/boundaries.rejoined_outputs``), where the prediction had settled it
  there and gathered it once more on each axis.
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("seq2seq_lm", "switch_transformers", "float32"),
    ("causal_lm", "granitemoe_swa", "bfloat16"),
    ("causal_lm", "gpt_neo", "float32"),
    ("causal_lm", "gemma3n_text", "bfloat16"),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,dtype", ROWS, ids=[f"{m}-{d}" for _, m, d in ROWS])
def test_forced_budget_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype):
    assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, dtype)
