"""A parameter read in another module's own code is gathered there too.

Mamba's mixer convolves with ``self.conv1d.weight`` itself (transformers' reference path,
without the ``causal_conv1d`` kernels), so the ``conv1d`` module's forward, where
``apply_plan`` gathers a parameter stored sharded, never runs around that read. DTensor's
convolution rule then ran the local shard of the depthwise filter ("Given groups=128,
expected weight to be at least 128 at dimension 0, but got weight of size [32, 1, 4]").
The plan names the mixer as a reader of the weight (``Plan.parameter_readers``), and the
mixer gathers it around its own forward.

Zamba2's and Falcon-H1's mixers also take a view of the weight that nothing reads: that
view is no use of the weight, and must not keep the plan from gathering it for the one use
there is (``tests/models/depthwise_dead_view.py``).

Gemma 4's model reads a row of its embedding's weight beside the embedding's own lookup
(``tests/models/padded_embedding.py``): the model's hook gathers the weight once for both,
and the row is taken from the gathered weight, where the prediction had the row taken from
the stored split and gathered once more.

NeoMME's head multiplies by its embedding's projection weight, tied under another name,
in the model's own code (``tests/models/tied_projection.py``): the model's hook gathers the
weight once, for the projection's product (inside, whose own hook finds it gathered) and
its own. The two gradients, partial where the batch is split, are summed and reduced once,
by the gather's backward. The engine used to redistribute the gathered weight again in
the inner hook, whose backward all-reduced the projection's gradient alone, and the
prediction reduced each read's gradient on its own.
"""

import pytest
from conftest import ROOT
from zoo import assert_matches_one_device, assert_step_runs_the_prediction

from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report

MODEL_FILE = ROOT / "tests" / "models" / "mamba.py"
DEAD_VIEW_FILE = ROOT / "tests" / "models" / "depthwise_dead_view.py"
DEAD_VIEW_WEIGHT = "mixer.conv1d.weight"
PADDED_FILE = ROOT / "tests" / "models" / "padded_embedding.py"
PADDED_WEIGHT = "model.embed_tokens.weight"
TIED_FILE = ROOT / "tests" / "models" / "tied_projection.py"
TIED_WEIGHT = "embed.proj.weight"
WEIGHTS = [f"backbone.layers.{i}.mixer.conv1d.weight" for i in range(2)]


def _planned(model_file, pinned: dict, memory_gib: float | None = None):
    """The plan on 2x4 with ``pinned`` parameters laid out as given."""
    loaded = load_model_file(str(model_file))
    plan, _ = suggest_with_report(
        loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"), memory_gib=memory_gib, pinned=pinned,
    )
    return plan


@pytest.fixture(scope="module")
def plan():
    """The filters stored split by channel on tp (as the coverage benchmark's forcing budget
    stores them): DTensor's convolution takes its weight whole, so it is gathered for use."""
    return _planned(MODEL_FILE, dict.fromkeys(WEIGHTS, ("R", "S(0)")))


def test_the_mixer_reads_the_convolution_weight(plan):
    for fqn in WEIGHTS:
        assert plan.parameters[fqn] == ("R", "S(0)")
        assert plan.parameter_uses[fqn] == ("R", "R")
        assert plan.parameter_readers[fqn] == (fqn.removesuffix(".conv1d.weight"),)
    assert set(plan.parameter_readers) <= set(plan.parameter_uses)


@pytest.mark.slow  # steps the model on a fake process group
def test_a_step_runs_the_predicted_collectives(plan):
    assert_step_runs_the_prediction(MODEL_FILE, "build_model", plan)


@pytest.mark.gloo
def test_matches_one_device_on_gloo(plan):
    assert_matches_one_device(MODEL_FILE, "build_model", plan)


@pytest.fixture(scope="module")
def dead_view_plan():
    """The filter stored split by channel on tp, read through a view nothing reads as well."""
    return _planned(DEAD_VIEW_FILE, {DEAD_VIEW_WEIGHT: ("R", "S(0)")})


def test_an_unread_view_is_no_use_of_the_weight(dead_view_plan):
    assert dead_view_plan.parameters[DEAD_VIEW_WEIGHT] == ("R", "S(0)")
    assert dead_view_plan.parameter_uses[DEAD_VIEW_WEIGHT] == ("R", "R")
    assert dead_view_plan.parameter_readers[DEAD_VIEW_WEIGHT] == ("mixer",)


@pytest.mark.slow  # steps the model on a fake process group
def test_a_step_with_an_unread_view_runs_the_predicted_collectives(dead_view_plan):
    assert_step_runs_the_prediction(DEAD_VIEW_FILE, "build_model", dead_view_plan)


@pytest.fixture(scope="module")
def padded_plan():
    """The embedding stored split by hidden dim on tp, gathered for its lookup."""
    return _planned(PADDED_FILE, {PADDED_WEIGHT: ("R", "S(1)")})


def test_a_row_read_beside_the_lookup_is_taken_from_the_gathered_weight(padded_plan):
    assert padded_plan.parameters[PADDED_WEIGHT] == ("R", "S(1)")
    assert padded_plan.parameter_uses[PADDED_WEIGHT] == ("R", "R")
    assert padded_plan.parameter_readers[PADDED_WEIGHT] == ("model",)
    assert_step_runs_the_prediction(PADDED_FILE, "build_model", padded_plan)


@pytest.fixture(scope="module")
def tied_plan():
    """The projection stored split over both axes and gathered whole for use, with a budget
    that splits the batch on tp: both reads' gradients are partial there."""
    return _planned(TIED_FILE, {TIED_WEIGHT: ("S(1)", "S(1)")}, memory_gib=0.01)


def test_a_weight_read_inside_and_around_its_module_is_gathered_once(tied_plan):
    assert tied_plan.tied_parameters == {"unembed.weight": TIED_WEIGHT}
    assert tied_plan.parameter_uses[TIED_WEIGHT] == ("R", "R")
    assert tied_plan.parameter_readers[TIED_WEIGHT] == ("",)
    assert tied_plan.modules["embed.proj"].inputs["[0][0]"] == ("R", "S(0)")  # the batch split on tp


@pytest.mark.slow  # steps the model on a fake process group
def test_the_gradients_of_both_reads_are_reduced_once(tied_plan):
    assert_step_runs_the_prediction(TIED_FILE, "build_model", tied_plan)


@pytest.mark.gloo
def test_a_weight_read_inside_and_around_its_module_matches_one_device(tied_plan):
    assert_matches_one_device(TIED_FILE, "build_model", tied_plan)
