"""Rows of the coverage benchmark whose step once failed or ran other collectives than
predicted where the backward reaches (or does not reach) a value, run as
``tests/integration/coverage_rows/test_coverage_rows.py`` runs its rows. The small cases of
each live with their stage: ``tests/unit/trace/test_grad_leaves.py`` (MRA),
``tests/unit/trace/test_no_grad.py`` (HRM), ``tests/unit/apply/test_unreached_parts.py`` (CvT).
"""

import pytest
from coverage_row import assert_row_runs_the_predicted_collectives, hf_row


@pytest.mark.slow  # plans the model three times
def test_mra_row_runs_the_predicted_collectives(tmp_path):
    """MRA without its CUDA kernel: before, the prediction left out the gradient its
    attention's output hook moves back (to the zeros, through the output projection)."""
    assert_row_runs_the_predicted_collectives(tmp_path, "masked_lm", "mra", "float32")


@pytest.mark.slow  # plans the model three times
def test_hrm_row_runs_the_predicted_collectives(tmp_path):
    """Before, the prediction gave the cycles run without autograd a backward, and their
    module calls the gradient moves of one (9 all_gathers on tp per projection, 6 ran).
    (HRM's forcing-budget plan splits only about a quarter of its weight bytes on both
    axes, so the row is checked here without ``coverage_row``'s sharding assertion.)"""
    model_file = tmp_path / "hrm_text.py"
    model_file.write_text(hf_row.hf_model_file_text("causal_lm", "hrm_text"))
    row = {"task": "causal_lm", "model_type": "hrm_text", "class": "hrm_text"}
    row = hf_row.run_row(row, model_file, ["float32"], numerics=False, numerics_max_step_s=0.0, out=tmp_path / "row.json")
    for budget in ("default", "forced"):
        assert row["stages"][f"collectives float32/{budget}"]["ok"], row["stages"][f"collectives float32/{budget}"]


@pytest.mark.slow  # plans the model three times
def test_cvt_trains_and_runs_the_predicted_collectives(tmp_path):
    """CvT's last stage splits off its class token and never reads the rest: its step failed
    in the backward with the default budget and the forcing one."""
    assert_row_runs_the_predicted_collectives(tmp_path, "image_classification", "cvt", "float32")
