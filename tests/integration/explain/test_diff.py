"""``autoplan diff``: two real plans of the 7B-shaped Llama on 2x4, one under a tighter
memory budget: the modules that differ, in words, and both predictions side by side."""

import json

import pytest
from conftest import EXAMPLES
from zoo import forced_plan

import autoplan
from autoplan.cli import main
from autoplan.explain.diff import diff_plans
from autoplan.model_file import load_model_file


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory):
    loaded = load_model_file(str(EXAMPLES / "llama_7b.py"))
    folder = tmp_path_factory.mktemp("diff")
    paths = []
    default = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), broadcast=False)
    tight = forced_plan(str(EXAMPLES / "llama_7b.py"))  # a budget the default plan exceeds
    assert tight.predicted.peak_memory_bytes < default.predicted.peak_memory_bytes
    for name, plan in (("default", default), ("tight", tight)):
        paths.append(plan.save(folder / f"{name}.json"))
    return paths


def _differing_modules(a, b) -> set[str]:
    return {
        fqn.rpartition(".")[0]
        for fqn in a.parameters
        if a.parameters[fqn] != b.parameters[fqn]
        or a.parameter_uses.get(fqn, a.parameters[fqn]) != b.parameter_uses.get(fqn, b.parameters[fqn])
    }


def _expand(name: str) -> set[str]:
    """ "model.layers.0-1.mlp" -> the module names a folded row stands for."""
    import re

    match = re.search(r"\.(\d+)-(\d+)(?=\.|$)", name)
    if not match:
        return {name}
    return {name[: match.start()] + f".{i}" + name[match.end():] for i in range(int(match.group(1)), int(match.group(2)) + 1)}


def test_diff_names_exactly_the_modules_whose_parameters_differ(two_plans, capsys):
    a, b = (autoplan.Plan.load(p) for p in two_plans)
    result = diff_plans(a, b)
    named = set().union(*(_expand(c.name) for c in result.changes))
    differing = _differing_modules(a, b)
    assert differing, "the tighter budget should change some layout"
    assert differing <= named
    assert b.predicted.peak_memory_bytes < a.predicted.peak_memory_bytes
    assert main(["diff", str(two_plans[0]), str(two_plans[1])]) == 0
    out = capsys.readouterr().out
    assert "modules laid out differently" in out and "predicted totals" in out
    assert f"{a.predicted.step_time_s * 1e3:.3f}" in out and f"{b.predicted.step_time_s * 1e3:.3f}" in out


def test_a_plan_against_itself_differs_nowhere(two_plans, capsys):
    assert main(["diff", str(two_plans[0]), str(two_plans[0]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changes"] == [] and data["batch"] == []
    step = next(row for row in data["totals"] if row[0] == "step time, ms")
    assert step[1] == step[2] and step[3] == "+0.0%"
