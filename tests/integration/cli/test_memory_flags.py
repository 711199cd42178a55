"""The memory budget says what it means: ``--memory-gb N`` / ``memory_gb=N`` is N x 10**9
bytes, ``--memory-gib N`` / ``memory_gib=N`` is N x 2**30 bytes, never both; printed in
the unit it was given, with its bytes. ``score`` judges a plan against the budget the plan
was made under unless told another, and says which (``pipeline/budget.py``); its peak
is split at the peak, so the parts add up to it.
"""

import dataclasses
import re

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.errors import OptionError
from autoplan.model_file import load_model_file
from autoplan.pipeline.budget import MemoryBudget, given_budget

MLP = str(EXAMPLES / "mlp.py")
MESH, AXES = (4,), ("dp",)


def _suggest(**budget):
    loaded = load_model_file(MLP)
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXES, profile="cpu-gloo",
                            cache=False, broadcast=False, **budget)


def test_the_two_units_and_their_words():
    assert given_budget(memory_gb=40) == MemoryBudget(40e9, "40 GB")
    assert given_budget(memory_gib=40) == MemoryBudget(40 * 2**30, "40 GiB")
    assert given_budget() is None
    assert given_budget(memory_gb=0.015).describe() == "0.015 GB (15,000,000 bytes = 0.01397 GiB), given"
    assert given_budget(memory_gib=0.015).describe() == "0.015 GiB (16,106,127 bytes), given"
    with pytest.raises(OptionError, match="got both memory_gb=40 and memory_gib=40; fix: give the budget once"):
        given_budget(memory_gb=40, memory_gib=40)
    with pytest.raises(OptionError, match="expected memory_gib > 0, got 0"):
        given_budget(memory_gib=0)


def test_the_api_plans_for_the_unit_it_was_given():
    assert _suggest(memory_gb=40).solver.memory_budget_bytes == 40 * 10**9
    assert _suggest(memory_gib=40).solver.memory_budget_bytes == 40 * 2**30
    with pytest.raises(OptionError, match="got both"):
        _suggest(memory_gb=40, memory_gib=40)


def test_the_command_line_takes_one_unit_and_prints_it(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    # the case: 0.015 GB is 15,000,000 bytes, not 0.015 GiB (15.36 MiB)
    assert main(["suggest", MLP, "--mesh", "4", "--memory-gb", "0.015", "--no-cache", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no plan fits the per-device budget of 0.015 GB (15,000,000 bytes = 0.01397 GiB)" in err[0]
    assert main(["suggest", MLP, "--mesh", "4", "--memory-gb", "1", "--memory-gib", "1", "--out", str(out)]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["suggest", MLP, "--mesh", "4", "--memory-gib", "0.5", "--no-cache", "--out", str(out)]) == 0
    assert "memory budget per device: 0.5 GiB (536,870,912 bytes), given" in capsys.readouterr().out
    assert autoplan.Plan.load(out).solver.memory_budget_bytes == 2**29


@pytest.fixture(scope="module")
def lean_plan():
    """The MLP planned under 0.05 GiB on 4 devices: its weights must be sharded to fit."""
    plan = _suggest(memory_gib=0.05)
    assert plan.solver.memory_budget_bytes == 0.05 * 2**30
    assert any(p != "R" for spec in plan.parameters.values() for p in spec)
    return plan


def test_score_judges_against_the_plans_own_budget_and_says_so(lean_plan):
    loaded = load_model_file(MLP)
    # replicated by hand: 4 copies of the whole model state no longer fit the plan's 0.05 GiB,
    # which the profile's device memory would hide
    replicated = dataclasses.replace(lean_plan, parameters=dict.fromkeys(lean_plan.parameters, ("R",)))
    scored = autoplan.score(loaded.model, loaded.example_inputs, replicated)
    assert scored.budget_bytes == 0.05 * 2**30 and not scored.fits
    assert "does NOT fit the per-device budget of 0.05 GiB (53,687,091 bytes), the budget the plan was made under" in scored.summary()
    profile = autoplan.load_profile("cpu-gloo")
    assert scored.peak_memory_bytes < profile.memory_bytes  # the old judge said "fits"
    older = dataclasses.replace(replicated, solver=dataclasses.replace(replicated.solver, memory_budget_bytes=None))
    fallback = autoplan.score(loaded.model, loaded.example_inputs, older)
    assert fallback.budget_bytes == profile.memory_bytes and fallback.fits
    assert "the profile's device memory" in fallback.summary()
    given = autoplan.score(loaded.model, loaded.example_inputs, replicated, memory_gb=1)
    assert given.budget_bytes == 10**9 and given.fits
    assert "fits the per-device budget of 1 GB (1,000,000,000 bytes = 0.9313 GiB), given" in given.summary()


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * _UNITS[unit]


def test_score_prints_the_peak_split_at_the_peak(lean_plan, tmp_path, capsys):
    path = lean_plan.save(tmp_path / "lean.json")
    assert main(["score", MLP, str(path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("peak memory per device"))
    peak, parts = re.match(r"peak memory per device ([0-9.]+ \w+), split at the peak: (.*)", line).groups()
    figures = re.findall(r"([a-z ]+) ([0-9.]+ (?:B|KiB|MiB|GiB))", parts)
    assert [name.strip() for name, _ in figures] == [
        "parameters", "gradients", "optimizer state", "activations kept for backward", "temporaries and buffers",
    ]
    assert sum(_bytes(f) for _, f in figures) == pytest.approx(_bytes(peak), rel=0.01)  # the split sums to the peak
    p = lean_plan.predicted
    held = sum(p.memory[k] for k in ("parameters", "gradients", "optimizer"))
    if p.model_state_bytes != held:  # the total over the step is labelled as such, with the reason
        assert "model state over the whole step" in out and "gradients are made during the backward" in out
    assert "model state 0." not in out and "activations 0." not in out  # not the old unlabelled pair
