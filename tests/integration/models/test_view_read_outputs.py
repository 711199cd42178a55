"""A module output that only reshaping views read is moved by the module's output hook.

DTensor moves an op's inputs to the layout the op's strategy wants, but a view's rule
takes its input as it comes and refuses a split it cannot carry through the reshape.
Falcon's fused q/k/v projection (num_heads + 2 heads of 16: 6 on a tiny config) is
viewed as heads right after it; planned leanly, its output is split by columns on tp, and
4 ranks cannot split 6 heads: the step failed ("Cannot unflatten unevenly sharded
tensor"). The plan now hands the projection's output over in the layout the view reads
(``plan/builder.py``), and the apply engine's hook moves it there.

The prediction follows that hook too (``plan/boundaries.output_hooks``): AFMoE's shared
experts run on the tokens flattened, and their row-parallel output, partial, is viewed back
outside them (``tests/models/flat_mlp.py``). The hook reduces it where the plan lays it out
whole; the prediction had the view run on the partial value and the residual add reduce-
scatter it to the block input's split, which never happens.
"""

import pytest
from conftest import ROOT
from zoo import assert_matches_one_device, assert_step_runs_the_prediction

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
FLAT_MLP_FILE = ROOT / "tests" / "models" / "flat_mlp.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


def _suggest(memory_gib):
    loaded = load_model_file(f"{MODEL_FILE}:falcon")
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, memory_gib=memory_gib,
                            cache=False)


@pytest.fixture(scope="module")
def lean_plan():
    """The plan under the least memory any plan needs, plus 2 %: the q/k/v output split on tp."""
    with pytest.raises(InfeasibleError) as refused:
        _suggest(1e-9)
    return _suggest(refused.value.smallest_bytes * 1.02 / 2**30)


@pytest.mark.slow  # plans twice
def test_the_projection_hands_over_what_the_heads_view_reads(lean_plan):
    qkv = lean_plan.modules["transformer.h.0.self_attention.query_key_value"].outputs[""]
    assert qkv[1] != "S(2)", qkv  # 6 heads of the fused projection do not split 4 ways
    assert_step_runs_the_prediction(MODEL_FILE, "falcon", lean_plan)


@pytest.mark.gloo
def test_matches_one_device_on_gloo(lean_plan):
    assert_matches_one_device(MODEL_FILE, "falcon", lean_plan)


def test_a_partial_output_viewed_outside_is_reduced_by_its_hook():
    loaded = load_model_file(str(FLAT_MLP_FILE))
    column, row = ("R", "S(0)"), ("R", "S(1)")  # Megatron's MLP on tp
    pinned = {"block.mlp.gate_proj.weight": column, "block.mlp.up_proj.weight": column,
              "block.mlp.down_proj.weight": row, "[0][0]": ("R", "S(1)")}  # the tokens split by sequence
    plan, _ = suggest_with_report(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, pinned=pinned)
    assert plan.modules["block.mlp.down_proj"].outputs[""] == ("R", "R")
    assert_step_runs_the_prediction(FLAT_MLP_FILE, "build_model", plan)
