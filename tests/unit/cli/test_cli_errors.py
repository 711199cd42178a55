"""CLI error paths that fail before the pipeline runs: one line on stderr, nothing written."""

import logging
import sys
import textwrap
import types

import pytest

from autoplan.cli import main

GOOD_MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Linear(4, 4)

def example_inputs():
    return (torch.randn(2, 4),)
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run in tmp_path so a default plans_out/ would land there too."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_model(directory, source, name="model.py"):
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def run_failing(workdir, capsys, argv):
    out_dir = workdir / "out"
    status = main(["suggest", *argv, "--out", str(out_dir / "plan.json")])
    captured = capsys.readouterr()
    assert status != 0
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplan: error:"), captured.err
    assert not out_dir.exists() and not (workdir / "plans_out").exists()
    return lines[0]


@pytest.mark.parametrize("mesh", ["2x", "a", "0x4", "2*4"])
def test_malformed_mesh(workdir, capsys, mesh):
    line = run_failing(workdir, capsys, [write_model(workdir, GOOD_MODEL), "--mesh", mesh])
    assert repr(mesh) in line and "--mesh 2x4" in line


def test_missing_model_file(workdir, capsys):
    line = run_failing(workdir, capsys, [str(workdir / "nope.py"), "--mesh", "2x4"])
    assert "nope.py does not exist" in line


def test_file_without_build_model(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL.replace("def build_model", "def other"))
    line = run_failing(workdir, capsys, [path, "--mesh", "2x4"])
    assert "does not define build_model()" in line and path in line


def test_file_without_named_builder(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL)
    line = run_failing(workdir, capsys, [f"{path}:make_big", "--mesh", "2x4"])
    assert "does not define make_big()" in line


def test_file_without_example_inputs(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL.replace("def example_inputs", "def inputs"))
    line = run_failing(workdir, capsys, [path, "--mesh", "2x4"])
    assert "does not define example_inputs()" in line


def test_file_that_fails_to_import(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL + "\nraise RuntimeError('boom\\nsecond line')\n")
    line = run_failing(workdir, capsys, [path, "--mesh", "2x4"])
    assert "could not import" in line and "boom" in line


def test_axis_names_count_mismatch(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL)
    line = run_failing(workdir, capsys, [path, "--mesh", "2x4", "--axis-names", "dp,cp,tp"])
    assert "3 axis names" in line and "2-axis mesh" in line


def test_debug_reraises(workdir):
    from autoplan.errors import MeshError

    with pytest.raises(MeshError):
        main(["--debug", "suggest", write_model(workdir, GOOD_MODEL), "--mesh", "2x"])
    with pytest.raises(MeshError):
        main(["suggest", write_model(workdir, GOOD_MODEL), "--mesh", "2x", "--debug"])


@pytest.mark.parametrize("flag", ["--memory-gb", "--memory-gib", "--time-limit"])
@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_non_positive_numbers_are_usage_errors(workdir, capsys, flag, value):
    status = main(["suggest", write_model(workdir, GOOD_MODEL), "--mesh", "2x4", flag, value])
    assert status == 2
    assert f"expected a number > 0, got '{value}'" in capsys.readouterr().err


# --- with a stand-in pipeline: the CLI's own writing and printing ----------------------------


class FakePlan:
    def to_json(self):
        return '{"plan": true}\n'


class FakeReport:
    extra = {}  # noqa: RUF012 - a stand-in report, never mutated

    def summary(self):
        return "summary line 1\nsummary line 2"

    def render(self, stream, verbose=False):
        stream.write(self.summary() + "\n")


@pytest.fixture
def fake_suggest(monkeypatch):
    calls = []

    def suggest_with_report(*args, **kwargs):
        calls.append((args, kwargs))
        return FakePlan(), FakeReport()

    module = types.SimpleNamespace(suggest_with_report=suggest_with_report)
    monkeypatch.setitem(sys.modules, "autoplan.pipeline.suggest", module)
    cached = types.SimpleNamespace(suggest_cached=suggest_with_report)
    monkeypatch.setitem(sys.modules, "autoplan.pipeline.cached", cached)
    return calls


def test_writes_plan_to_default_path(workdir, capsys, fake_suggest):
    path = write_model(workdir, GOOD_MODEL, name="tiny.py")
    argv = ["suggest", path, "--mesh", "2x4", "--memory-gb", "80", "--profile", "h100"]
    assert main(argv) == 0
    plan = workdir / "plans_out" / "tiny-2x4.json"
    assert plan.read_text() == '{"plan": true}\n'
    assert capsys.readouterr().out.splitlines()[-1] == "plan written to plans_out/tiny-2x4.json"
    (((_, _, *settings), options),) = fake_suggest
    assert settings == [(2, 4), ("dp", "tp"), "h100", 80.0, None]
    assert options == {"loss_fn": None}  # the model file defines no compute_loss


def test_unwritable_out_is_one_line_error(workdir, capsys, fake_suggest):
    (workdir / "taken").write_text("a file, not a directory")
    argv = ["suggest", write_model(workdir, GOOD_MODEL), "--mesh", "8", "--out", "taken/plan.json"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["autoplan: error: cannot write --out taken/plan.json: taken is not a directory; fix: pass a writable --out path"]
    assert fake_suggest == []  # refused before planning


def test_ctrl_c_is_one_line_and_exit_130(workdir, capsys):
    path = write_model(workdir, GOOD_MODEL.replace("return nn.Linear(4, 4)", "raise KeyboardInterrupt"))
    assert main(["suggest", path, "--mesh", "8", "--out", "out/plan.json"]) == 130
    assert capsys.readouterr().err == "autoplan: interrupted\n"
    assert not (workdir / "out").exists()


def test_model_file_calling_sys_exit_is_named(workdir, capsys):
    path = write_model(workdir, "import sys\nsys.exit(3)\n")
    line = run_failing(workdir, capsys, [path, "--mesh", "8"])
    assert "called sys.exit(3) while being imported" in line and '__name__ == "__main__"' in line


def test_torch_log_records_only_with_debug(workdir, capsys, caplog):
    """A wrong input shape makes torch log a traceback from fake-tensor dispatch; the user
    sees autoplan's one line, and torch's records only with --debug."""
    path = write_model(workdir, GOOD_MODEL.replace("torch.randn(2, 4)", "torch.randn(2, 7)"))
    line = run_failing(workdir, capsys, [path, "--mesh", "2", "--no-cache"])
    assert "could not trace the model" in line
    assert not [r for r in caplog.records if r.name.startswith("torch") and r.levelno >= logging.WARNING]
    with pytest.raises(Exception):  # noqa: B017 - --debug re-raises the tracer's own error, whatever its type
        main(["--debug", "suggest", path, "--mesh", "2", "--no-cache", "--out", str(workdir / "p.json")])
    assert [r for r in caplog.records if r.name.startswith("torch") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("argv,words", [
    ([], "give --mesh"),
    (["--mesh", "2x4", "--devices", "8"], "give --mesh"),
    (["--mesh", "2x4", "--devices-per-node", "4"], "--devices-per-node goes with --devices"),
])
def test_mesh_or_devices_one_of_them(workdir, capsys, argv, words):
    line = run_failing(workdir, capsys, [write_model(workdir, GOOD_MODEL), *argv])
    assert words in line


def test_a_pipeline_axis_needs_a_stack_of_blocks(workdir, capsys):
    line = run_failing(workdir, capsys, [write_model(workdir, GOOD_MODEL), "--mesh", "2x2", "--axis-names", "pp,dp"])
    assert "a pipeline axis needs a stack of identical blocks" in line
