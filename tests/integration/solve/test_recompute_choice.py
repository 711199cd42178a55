"""The solver checkpoints the repeated layers when the budget needs it (issue 17).

A four-layer Llama (``tests/models/deep_llama.py``) on 2x4: the least any plan needs with
checkpointing is below the least without it; under a budget between the two, the plan
checkpoints the first layers alike (``Plan.recompute``), as few as the budget needs and
never the last (its backward runs first: checkpointing it frees nothing at the peak),
the same question without
checkpointing (``recompute=False``, ``--no-recompute``) has no plan, and the plan runs as
predicted: its collectives (the reruns' included) on a fake process group, and its loss
and gradients on gloo processes against one device.
"""

from dataclasses import replace

import pytest
from conftest import ROOT
from zoo import assert_matches_one_device, verify_on_fake_world

import autoplan
from autoplan.cli import main
from autoplan.errors import InfeasibleError
from autoplan.evaluate.baselines import build_baseline
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODEL = ROOT / "tests" / "models" / "deep_llama.py"
MESH = (2, 4)


def _suggest(memory_gib: float, recompute: bool = True):
    loaded = load_model_file(str(MODEL))
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, memory_gib=memory_gib, cache=False,
                            broadcast=False, recompute=recompute)


def _least(recompute: bool) -> float:
    with pytest.raises(InfeasibleError) as err:
        _suggest(1e-12, recompute)
    return err.value.smallest_bytes


@pytest.fixture(scope="module")
def between():
    """(the budget between the two least peaks, in GiB; the plan under it)."""
    with_checkpoints, without = _least(True), _least(False)
    assert with_checkpoints < 0.8 * without
    budget_gib = (with_checkpoints + without) / 2 / 2**30
    return budget_gib, _suggest(budget_gib)


@pytest.mark.slow  # plans a 4-layer model five times
def test_the_solver_checkpoints_the_first_layers_the_budget_needs(between, tmp_path, capsys):
    budget_gib, plan = between
    count = len(plan.recompute)
    assert 1 <= count <= 3 and set(plan.recompute) == {f"model.layers.{i}" for i in range(count)}
    assert len(set(plan.recompute.values())) == 1 and set(plan.recompute.values()) <= {"full", "selective"}
    assert plan.predicted.peak_memory_bytes <= budget_gib * 2**30
    # one layer fewer does not fit: the same layout scored with the last checkpointed layer left out
    loaded = load_model_file(str(MODEL))
    fewer = dict(list(plan.recompute.items())[:-1])
    scored = autoplan.score(loaded.model, loaded.example_inputs, replace(plan, recompute=fewer), memory_gib=budget_gib)
    assert not scored.fits and scored.step_time_s < plan.predicted.step_time_s
    with pytest.raises(InfeasibleError):
        _suggest(budget_gib, recompute=False)
    out = tmp_path / "plan.json"
    code = main(["suggest", str(MODEL), "--mesh", "2x4", "--memory-gib", repr(budget_gib), "--no-recompute", "--no-cache",
                 "--out", str(out)])
    assert code != 0 and not out.exists()
    assert "no plan fits" in capsys.readouterr().err
    roomy = _suggest(100.0)
    assert roomy.recompute == {} and roomy.predicted.step_time_s < plan.predicted.step_time_s


@pytest.mark.slow
def test_a_plan_that_checkpoints_runs_its_collectives_as_predicted(between):
    _, plan = between
    module = import_model_file(MODEL)
    result = verify_on_fake_world(build_seeded(module, "build_model", 0), seeded_batch(module, 1), plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.gloo
def test_a_plan_that_checkpoints_trains_as_one_device(between):
    _, plan = between
    assert_matches_one_device(MODEL, "build_model", plan)


@pytest.mark.slow
def test_score_gives_a_checkpointing_plan_its_prediction_back_and_baselines_take_a_mode(between):
    budget_gib, plan = between
    loaded = load_model_file(str(MODEL))
    scored = autoplan.score(loaded.model, loaded.example_inputs, plan, memory_gib=budget_gib)
    assert scored.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-6)
    assert scored.peak_memory_bytes == plan.predicted.peak_memory_bytes
    loaded = load_model_file(str(MODEL))
    full = build_baseline("torchtitan", loaded.model, loaded.example_inputs, mesh=MESH, recompute="full").plan
    loaded = load_model_file(str(MODEL))
    none = build_baseline("torchtitan", loaded.model, loaded.example_inputs, mesh=MESH).plan
    assert set(full.recompute.values()) == {"full"} and len(full.recompute) == 4 and none.recompute == {}
    assert full.parameters == none.parameters
    assert full.predicted.step_time_s > none.predicted.step_time_s
    assert full.predicted.peak_memory_bytes < none.predicted.peak_memory_bytes
