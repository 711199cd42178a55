"""No gradient goes back through an integer tensor (``plan/reached.reached_by_backward``).

DeepSeek V3.2's and GLM-5's sparse attention reads only the top-k indices its indexer
picks (``tests/models/topk_indexer.py``): the indexer leads to the loss, but through
integers, so neither its projections nor its input get a gradient from it. The prediction
had its input's gradient partial where it reads it replicated with split weights, and
all-reduced that share, which never runs.
"""

from conftest import ROOT
from zoo import assert_step_runs_the_prediction

from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report

MODEL_FILE = ROOT / "tests" / "models" / "topk_indexer.py"


def test_no_gradient_goes_back_through_the_indices():
    loaded = load_model_file(str(MODEL_FILE))
    split = ("R", "S(0)")  # column-parallel on tp: the input's gradient would be partial there
    pinned = {"attn.indexer.wq.weight": split, "attn.indexer.wk.weight": split}
    plan, _ = suggest_with_report(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"), pinned=pinned)
    assert plan.parameters["attn.indexer.wq.weight"] == split
    assert_step_runs_the_prediction(MODEL_FILE, "build_model", plan)
