"""Must-show 4: the CLI on the shipped examples writes plans that load back identical,
and two runs give byte-identical files. Also: an infeasible budget is a one-line error."""

import pytest
from conftest import EXAMPLES

from autoplan import Plan
from autoplan.cli import main


@pytest.mark.parametrize("model,mesh", [("mlp.py", "4"), ("cnn.py", "2x4"), ("llama.py", "2x4"), ("mlp.py", "2x2x2")])
def test_cli_plan_round_trips_and_is_deterministic(tmp_path, capsys, model, mesh):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    # --no-cache: both runs solve, so equal bytes show the planner is deterministic.
    assert main(["suggest", str(EXAMPLES / model), "--mesh", mesh, "--out", str(first), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "predicted step time" in out and "peak memory per device" in out and "solver optimal" in out
    assert main(["suggest", str(EXAMPLES / model), "--mesh", mesh, "--out", str(second), "--no-cache"]) == 0
    assert first.read_bytes() == second.read_bytes()
    plan = Plan.load(first)
    assert plan.to_json() == first.read_text()
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.mesh_shape == tuple(int(n) for n in mesh.split("x"))
    assert all(len(spec) == len(plan.mesh_shape) for spec in plan.parameters.values())


def test_infeasible_budget_is_one_line_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "plans" / "p.json"
    code = main(["suggest", str(EXAMPLES / "mlp.py"), "--mesh", "4", "--memory-gb", "0.0001", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and "no plan fits" in err[0] and "--memory-gb" in err[0]
    assert not out.exists() and not out.parent.exists()


def test_plan_file_errors_name_the_problem(tmp_path):
    from autoplan.errors import PlanError

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(bad)
    with pytest.raises(PlanError, match="no plan file"):
        Plan.load(tmp_path / "missing.json")
    good = tmp_path / "good.json"
    assert main(["suggest", str(EXAMPLES / "mlp.py"), "--mesh", "4", "--out", str(good)]) == 0
    data = Plan.load(good).to_dict()
    data["parameters"]["0.weight"] = ["S(0)", "R"]
    with pytest.raises(PlanError, match="one placement per mesh axis"):
        Plan.from_dict(data)
    data["parameters"]["0.weight"] = ["X"]
    with pytest.raises(PlanError, match="unknown placement"):
        Plan.from_dict(data)
