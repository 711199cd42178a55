"""Scoring plans: ``autoplan.score`` and ``autoplan score``.

Scoring a plan the planner just made, with the same profile, gives back its own
prediction (its solution satisfies every pin, and was the optimum of a larger problem);
another profile prices the same layout differently; a plan for another model, batch or
mesh is refused with a message naming the mismatch.
"""

import dataclasses

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.model_file import load_model_file

LLAMA = str(EXAMPLES / "llama.py")


@pytest.fixture(scope="module")
def llama():
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), profile="cpu-gloo")
    return loaded, plan


def test_score_of_a_suggested_plan_is_its_prediction(llama):
    loaded, plan = llama
    score = autoplan.score(loaded.model, loaded.example_inputs, plan)
    assert score.profile == "cpu-gloo"  # the plan's own profile by default
    assert score.step_time_s == plan.predicted.step_time_s
    assert score.compute_s == plan.predicted.compute_s
    assert score.comm_s == plan.predicted.comm_s
    assert score.peak_memory_bytes == plan.predicted.peak_memory_bytes
    assert score.fits and score.pinned_values == len(plan.parameters) + len(plan.inputs)
    assert score.pinned_boundaries > 0 and not score.skipped_boundaries
    assert score.plan.parameters == plan.parameters and score.plan.modules == plan.modules


def test_another_profile_prices_the_same_layout_differently(llama):
    loaded, plan = llama
    on_h100 = autoplan.score(loaded.model, loaded.example_inputs, plan, profile="h100-sxm")
    assert on_h100.profile == "h100-sxm"
    assert on_h100.step_time_s < plan.predicted.step_time_s  # an H100 is faster than a gloo CPU rank
    assert on_h100.plan.parameters == plan.parameters
    assert on_h100.peak_memory_bytes == plan.predicted.peak_memory_bytes  # memory does not depend on the profile


def test_plan_for_another_model_batch_or_mesh_is_refused(llama):
    loaded, plan = llama
    other = load_model_file(str(EXAMPLES / "mlp.py"))
    with pytest.raises(PlanError, match="does not match the model"):
        autoplan.score(other.model, other.example_inputs, plan)
    with pytest.raises(PlanError, match=r"fingerprint .* is not this model's"):
        autoplan.score(loaded.model, loaded.example_inputs, dataclasses.replace(plan, fingerprint="sha256:0"))
    short = {key: value[:, :16] for key, value in loaded.example_inputs.items()}
    with pytest.raises(PlanError, match=r"has shape \[8, 16\], the plan was made for \[8, 32\]"):
        autoplan.score(loaded.model, short, plan)
    with pytest.raises(PlanError, match="the plan is for a 2x4 mesh, got 4x2"):
        autoplan.score(loaded.model, loaded.example_inputs, plan, mesh=(4, 2))
    uneven = dict(plan.parameters)
    uneven["lm_head.weight"] = ("S(1)", "S(1)")  # width 64 on 2 x 4 ways: fine; 3 ways would not be
    autoplan.score(loaded.model, loaded.example_inputs, dataclasses.replace(plan, parameters=uneven))
    uneven["lm_head.weight"] = ("_S(1, 2)", "S(1)")  # a strided split names the later axes' split: 4 ways
    with pytest.raises(PlanError, match=r"lm_head.weight as \[_S\(1, 2\), S\(1\)\] cannot be executed on this mesh: "
                                        r"_S\(1, 2\) must be followed by axes that split dim 1 2 ways \(they split it 4 ways\)"):
        autoplan.score(loaded.model, loaded.example_inputs, dataclasses.replace(plan, parameters=uneven))


def test_cli_prints_the_figures_and_refuses_a_mismatch_in_one_line(llama, tmp_path, capsys):
    _, plan = llama
    path = plan.save(tmp_path / "llama.json")
    assert main(["score", LLAMA, str(path), "--profile", "cpu-gloo", "--mesh", "2x4"]) == 0
    out = capsys.readouterr().out
    assert f"predicted step time {plan.predicted.step_time_s * 1e3:.3f} ms" in out
    assert "compute" in out and "communication" in out and "peak memory per device" in out
    assert main(["score", str(EXAMPLES / "gpt2.py"), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not match the model" in err[0] and "fix:" in err[0]
