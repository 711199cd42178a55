"""``autoplan explain``: the alternatives per block are real solves of the planning problem,
and an alternative's explained step time is exactly what ``autoplan score`` gives for the
same layout (its plan, saved and scored from the file, a fresh trace and problem)."""

import json
import re

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.explain.alternatives import PLAN_OWN
from autoplan.explain.explain import explain_plan
from autoplan.model_file import load_model_file

LLAMA = str(EXAMPLES / "llama.py")
BUDGET_GIB = 0.001  # small enough that the tiny Llama's plan must shard its weights


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), memory_gib=BUDGET_GIB, broadcast=False)
    path = tmp_path_factory.mktemp("explain") / "plan.json"
    plan.save(path)
    result = explain_plan(loaded.model, loaded.example_inputs, plan, module="model.layers.0.mlp", memory_gib=BUDGET_GIB)
    return loaded, plan, path, result


@pytest.mark.slow
def test_an_alternatives_explained_time_is_its_score(explained, tmp_path, capsys):
    loaded, _plan, _, result = explained
    others = [a for a in result.alternatives if not a.name.startswith(PLAN_OWN) and not a.error]
    assert len(others) >= 3, [a.name for a in result.alternatives]
    names = {a.name for a in others}
    assert {"replicated (data parallel)", "Megatron on tp"} <= names
    for alt in others[:2]:
        scored = autoplan.score(loaded.model, loaded.example_inputs, alt.plan, memory_gib=BUDGET_GIB)
        assert scored.step_time_s == alt.step_time_s, alt.name
        assert scored.peak_memory_bytes == alt.peak_memory_bytes and scored.fits == alt.fits
    # and through the command line, from the plan file, to the printed microsecond
    mega = next(a for a in others if a.name == "Megatron on tp")
    path = tmp_path / "megatron.json"
    mega.plan.save(path)
    assert main(["score", LLAMA, str(path), "--memory-gib", str(BUDGET_GIB)]) == 0
    printed = re.search(r"predicted step time ([0-9.]+) ms", capsys.readouterr().out).group(1)
    assert printed == f"{mega.step_time_s * 1e3:.3f}"
    # the pinned block really is laid out as the alternative says
    for fqn in mega.plan.parameters:
        if ".mlp.up_proj." in fqn:
            assert mega.plan.parameters[fqn] == ("R", "S(0)")
        if ".mlp.down_proj." in fqn:
            assert mega.plan.parameters[fqn] == ("R", "S(1)")


@pytest.mark.slow
def test_the_plans_own_row_is_the_plan_and_the_rest_cost_no_less(explained):
    _, plan, _, result = explained
    assert result.own.step_time_s == plan.predicted.step_time_s
    own = next(a for a in result.alternatives if a.name.startswith(PLAN_OWN))
    assert own.step_time_s == plan.predicted.step_time_s and own.delta_s == 0
    # every alternative that fits is a subset of what suggest searched: never faster
    assert all(a.step_time_s >= plan.predicted.step_time_s for a in result.alternatives if a.fits and not a.error)


@pytest.mark.slow
def test_largest_charges_and_what_binds(explained, capsys):
    _loaded, plan, path, result = explained
    seconds = [c.seconds for c in result.charges]
    assert 0 < len(seconds) <= 10 and seconds == sorted(seconds, reverse=True)
    assert sum(seconds) <= plan.predicted.comm_s * (1 + 1e-6)
    assert all(c.module and c.tensor for c in result.charges)
    # a 1 MB budget forces sharding that costs time: memory binds
    assert result.binds.startswith("memory binds") and result.free_step_time_s < plan.predicted.step_time_s
    assert main(["explain", LLAMA, str(path), "--module", "model.norm", "--memory-gib", str(BUDGET_GIB), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {a["unit"] for a in data["alternatives"]} == {"model.norm"}
    assert data["plan"]["step_time_s"] == plan.predicted.step_time_s


def test_explain_of_a_module_the_plan_lacks_is_one_line_error(tmp_path, capsys):
    plan = tmp_path / "mlp.json"
    assert main(["suggest", str(EXAMPLES / "mlp.py"), "--mesh", "2x4", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["explain", str(EXAMPLES / "mlp.py"), str(plan), "--module", "encoder.layers.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no parameters under module 'encoder.layers.0'" in err[0] and "fix:" in err[0]
