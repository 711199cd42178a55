"""A planned training step that fails says where, in one line, and exits non-zero."""

from conftest import ROOT

from autoplan.cli import main

MODEL = ROOT / "tests" / "models" / "host_stat_mlp.py"


def test_a_failing_step_names_the_module_in_one_line(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["suggest", str(MODEL), "--mesh", "2x2", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["verify", str(MODEL), str(plan)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "the planned training step failed in module 1 (LoggedReLU)" in lines[0]
    assert "Traceback" not in err
