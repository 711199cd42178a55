"""DeepSeek-V3's multi-head latent attention (value heads narrower than query and key
heads) plans and runs its predicted collectives. The fused attention kernel takes one head
size for Q, K and V, so such a call is traced as the math torch runs instead; traced as the
fused kernel, its output took the query's head size and the model's ``o_proj`` failed."""

import pytest
from conftest import ROOT
from zoo import verify_on_fake_world

import autoplan
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"


@pytest.mark.slow  # plans and steps a mixture-of-experts model
def test_latent_attention_plans_and_runs_its_prediction():
    loaded = load_model_file(f"{MODEL_FILE}:deepseek_v3")
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"))
    model_file = import_model_file(MODEL_FILE)
    result = verify_on_fake_world(build_seeded(model_file, "deepseek_v3", 0), seeded_batch(model_file, 1), plan)
    assert result.passed, "\n" + result.summary()
