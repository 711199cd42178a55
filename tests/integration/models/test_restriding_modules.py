"""A module that restrides a tensor (``as_strided``) runs as an opaque region, so its model trains.

DTensor refuses ``as_strided`` in every layout but the identity, forward and backward.
HuggingFace's Swin pools its tokens with ``nn.AdaptiveAvgPool1d``, which torch computes
with a mean and an in-place restride of the pooled result: planned as it was, the step
failed in the backward ("as_strided not supported with DTensor"). The trace finds the
innermost module that restrides (``trace/tracer.py``), traces it again as one opaque
region, and ``apply_plan`` runs it on whole tensors (``trace/opaque.py``).
"""

import pytest
from conftest import ROOT
from zoo import assert_matches_one_device, assert_step_runs_the_prediction, forced_plan

import autoplan
from autoplan.model_file import load_model_file
from autoplan.trace.opaque import RESTRIDES

MODEL_FILE = str(ROOT / "tests" / "models" / "swin.py")
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


@pytest.fixture(scope="module")
def plans():
    loaded = load_model_file(MODEL_FILE)
    default = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, cache=False)
    return {"default": default, "forced": forced_plan(MODEL_FILE, MESH, AXIS_NAMES)}


def test_the_pooler_alone_is_an_opaque_region(plans):
    plan = plans["default"]
    assert plan.opaque_modules == ("swin.pooler",)
    assert any(w.startswith(f"module swin.pooler (AdaptiveAvgPool1d) {RESTRIDES}") for w in plan.warnings)
    assert not any("upper bound" in w for w in plan.warnings)  # its cost is exact, unlike a data-dependent region's


@pytest.mark.slow  # plans the model three times
@pytest.mark.parametrize("budget", ["default", "forced"])
def test_a_step_runs_the_predicted_collectives(plans, budget):
    plan = plans[budget]
    if budget == "forced":
        assert any(p.startswith("S(") for spec in plan.parameters.values() for p in spec)
    assert_step_runs_the_prediction(MODEL_FILE, "build_model", plan)


@pytest.mark.gloo
def test_matches_one_device_on_gloo(plans):
    assert_matches_one_device(MODEL_FILE, "build_model", plans["forced"])
