"""Rows of the coverage benchmark at its batch shapes that do not divide the 2x4 mesh
(``benchmarks/hf_coverage.py --shapes``), run as ``test_coverage_rows.py`` runs its rows:
tiny config as shipped, plans with the default and the forcing budget, one fake-process-group
step each, collectives compared with the prediction.

- 4 x 64 (fewer examples than the mesh's 8 devices): the batch cannot split over both
  axes, so a plan that splits it lays the ids out by examples on one axis and by tokens (or
  not at all) on the other, and any move of the integer inputs (ids, labels) to where their
  readers want them is a collective the plan must price and predict like any other.
- 6 x 15 (examples that divide dp but not tp, tokens that divide neither): the inputs can
  only be split by examples on dp; tp holds them whole, and the loss's shifted labels, the
  position ids and the masks are read at sizes no axis divides.

One row per family: a decoder (Llama), an encoder (BERT, masked LM), an encoder-decoder
(T5) and an image classifier (ViT, whose images keep their size: the examples change).
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives

ROWS = [
    ("causal_lm", "llama", (4, 64)),
    ("masked_lm", "bert", (6, 15)),
    ("seq2seq_lm", "t5", (6, 15)),
    ("image_classification", "vit", (4, 64)),
]


@pytest.mark.slow  # plans each model three times
@pytest.mark.parametrize("task,model_type,shape", ROWS, ids=[f"{m}-{b}x{s}" for _, m, (b, s) in ROWS])
def test_batch_shape_row_runs_the_predicted_collectives(tmp_path, task, model_type, shape):
    row = assert_row_runs_the_predicted_collectives(tmp_path, task, model_type, "float32", shape)
    # The forcing budget's plan splits the batch, at a shape that cannot split over the whole mesh.
    forced = row["stages"]["plan float32/forced"]["inputs"]
    assert any(p.startswith("S(") for spec in forced.values() for p in spec), forced
    # Only even splits are offered (``placements.candidate_specs``): no input is split by
    # examples over both axes, which would give some ranks none (4 or 6 examples over 8).
    assert not any(all(p == "S(0)" for p in spec) for spec in forced.values()), forced
