"""A module's output hook moves what the module returns, after the module's own ops have
read it (``plan/collectives.py``: ``made`` for a reader inside the module).

GraniteMoE's router returns its logits, laid out whole, and takes their top-k itself
(``tests/models/scaled_router.py``). Its logits come partial out of a row-parallel
product, and DTensor runs the scaling (GraniteMoE's cast) on the partial value: the top-k
reduces them for itself, and the router's output hook reduces them once more. The
prediction had the top-k read them as the hook leaves them, reduced once.
"""

from conftest import ROOT
from zoo import assert_step_runs_the_prediction

from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report

MODEL_FILE = ROOT / "tests" / "models" / "scaled_router.py"


def test_a_read_inside_the_module_comes_before_its_output_hook():
    loaded = load_model_file(str(MODEL_FILE))
    pinned = {"proj.weight": ("R", "S(0)"), "router.weight": ("R", "S(1)")}  # Megatron's pair on tp
    plan, _ = suggest_with_report(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"), pinned=pinned)
    assert plan.modules["router"].outputs["[0]"] == ("R", "R")
    assert_step_runs_the_prediction(MODEL_FILE, "build_model", plan)
