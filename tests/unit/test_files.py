"""Outputs checked against inputs before work, all-or-nothing writes, stale temp files removed."""

import os
import subprocess
import sys

import pytest
from conftest import EXAMPLES

from autoplan._files import check_outputs, remove_stale_temps, write_all_atomic, write_atomic
from autoplan.cli import main
from autoplan.errors import OptionError


def test_output_that_is_an_input_is_refused(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("x = 1\n")
    with pytest.raises(OptionError, match="--out .*model.py is the model file: writing it would destroy an input"):
        check_outputs({"--out": model}, {"the model file": model})
    link = tmp_path / "link.py"
    os.link(model, link)  # a hard link is the same file under another name
    with pytest.raises(OptionError, match="is the model file"):
        check_outputs({"--out": link}, {"the model file": model})
    assert model.read_text() == "x = 1\n"


def test_two_outputs_on_one_path_are_refused(tmp_path):
    with pytest.raises(OptionError, match="--out and --stats are the same file"):
        check_outputs({"--out": tmp_path / "x.json", "--stats": tmp_path / "sub" / ".." / "x.json"}, {})


def test_unwritable_output_is_refused_before_work(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OptionError, match="is not a directory"):
        check_outputs({"--out": tmp_path / "file" / "plan.json"}, {})
    with pytest.raises(OptionError, match="is a directory"):
        check_outputs({"--out": tmp_path}, {})
    with pytest.raises(OptionError, match="a file cannot be created in /proc"):
        check_outputs({"--stats": "/proc/autoplan_stats.json"}, {})


def test_a_failed_write_changes_no_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text("good plan\n")
    with pytest.raises(OSError):
        write_all_atomic({good: "new plan\n", "/proc/autoplan_stats.json": "stats\n"})
    assert good.read_text() == "good plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"]


@pytest.mark.slow  # starts a process
def test_temp_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "plan.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from autoplan import _files

    stale = tmp_path / f".plan.json.{_files._HOST}-{int(dead.stdout)}.abc123.tmp"
    live = tmp_path / f".plan.json.{_files._HOST}-{os.getpid()}.def456.tmp"  # a writer still running
    other = tmp_path / f".other.json.{_files._HOST}-{int(dead.stdout)}.abc123.tmp"
    for path in (stale, live, other):
        path.write_text("half")
    write_atomic(target, "plan\n")
    assert target.read_text() == "plan\n"
    assert not stale.exists() and live.exists() and other.exists()
    remove_stale_temps(tmp_path / "other.json")
    assert not other.exists()


def test_cli_refuses_to_write_over_its_inputs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "mlp.py"
    model.write_text((EXAMPLES / "mlp.py").read_text())
    before = model.read_bytes()
    assert main(["suggest", str(model), "--mesh", "2x4", "--out", str(model)]) == 2
    assert main(["suggest", str(model), "--mesh", "2x4", "--out", "x.json", "--stats", "x.json"]) == 2
    plan = tmp_path / "good.json"
    plan.write_text("{}")
    assert main(["export", str(plan), "--format", "torch", "--out", str(plan)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[2].split(";")[0] for line in lines] == [
        f"--out {model} is the model file", "--out and --stats are the same file x.json", f"--out {plan} is the plan file",
    ]
    assert model.read_bytes() == before and plan.read_text() == "{}" and not (tmp_path / "x.json").exists()


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_child_dies_with_its_launcher_killed_outright(tmp_path):
    """What calibrate's and verify's ranks do: kill -9 of the launcher takes the child too."""
    import signal
    import time

    from conftest import ROOT

    launcher = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'from autoplan._processes import die_with_parent; "
        "import os, sys, time; die_with_parent(int(sys.argv[1])); print(os.getpid(), flush=True); time.sleep(60)', "
        "str(os.getpid())], stdout=sys.stdout)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, env=env)
    child = int(proc.stdout.readline())  # armed
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.1)
    assert not _running(child)


RANKS_THAT_WAIT = """
import os, time
from autoplan._processes import die_with_parent

def rank(rank, launcher, out):
    die_with_parent(launcher)
    with open(os.path.join(out, f"{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, f"{rank}.tmp"), os.path.join(out, str(rank)))
    time.sleep(60)
"""


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_forked_by_the_fork_server_die_with_their_launcher_killed_outright(tmp_path):
    """verify's gloo ranks (``_processes.start_ranks``) are children of a fork server, not of
    the launcher: they live while it does, and kill -9 of the launcher takes them too."""
    import signal
    import time

    from conftest import ROOT

    (tmp_path / "ranks_that_wait.py").write_text(RANKS_THAT_WAIT)
    launcher = (
        "import os, sys\n"
        "from autoplan._processes import start_ranks\n"
        "import ranks_that_wait\n"
        f"start_ranks(ranks_that_wait.rank, (os.getpid(), {str(tmp_path)!r}), nprocs=2)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-c", launcher], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all((tmp_path / str(r)).exists() for r in range(2)):
        time.sleep(0.1)
    ranks = [int((tmp_path / str(r)).read_text()) for r in range(2)]  # both armed and still running
    assert all(_running(pid) for pid in ranks)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in ranks):
        time.sleep(0.1)
    assert not any(_running(pid) for pid in ranks)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
