"""Importing autoplan changes nothing in DTensor; planning and running a plan leave it as found.

Each check runs in a fresh interpreter (``tests/scripts/dtensor_state.py``), so that no
earlier test's imports or plans are in the process.
"""

import functools
import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow  # each check starts a fresh interpreter

SCRIPT = ROOT / "tests" / "scripts" / "dtensor_state.py"


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.cache
def _mlp_alone() -> dict:
    """torch's own tensor parallelism on the MLP in a fresh interpreter without autoplan
    (``_run("mlp")``): the baseline two tests compare with, run once for both."""
    return _run("mlp")


def test_importing_every_autoplan_module_leaves_dtensor_untouched():
    found = _run("import")
    assert found["modules"] > 40  # every module was imported, not just the package
    assert found["changed"] == []


def test_install_changes_dtensor_and_uninstall_restores_it_exactly():
    found = _run("install")
    # While installed, the selection, the views' rules, the move and the kernels are autoplan's,
    # and so are the custom op handlers (the loss's added, the convolutions' set aside) and
    # the masked fills' single-axis rules (a zero fill keeps a partial).
    assert set(found["changed_while_installed"]) == {
        "select", "move", "strategy_funcs", "single_dim", "schema_info", "fake_kernels", "cache", "uncached", "dispatcher",
        "handlers",
    }
    assert found["changed_after_nested_uninstall"] == found["changed_while_installed"]
    assert found["changed"] == []


def test_plain_tensor_parallel_runs_the_same_collectives_after_autoplan_planned_and_trained():
    """torch's own ``parallelize_module`` (Colwise then Rowwise on an MLP whose activation is
    reshaped between them) issues the collectives it issues without autoplan imported,
    after autoplan planned a Llama that shards its weights and ran a training step of it."""
    alone = _mlp_alone()
    after = _run("plan-then-mlp")
    assert after["planned_and_stepped"] and after["weights_split"]
    assert after["changed"] == []
    assert alone["mlp"] == after["mlp"]
    assert alone["mlp"]["collectives"]  # the program does communicate


def test_a_backward_that_raises_leaves_dtensor_as_found():
    """The overrides a planned model's backward installs come off when that backward fails
    (a device out of memory, say), not only when it ends: torch's own tensor parallelism
    then runs as it does without autoplan."""
    alone = _mlp_alone()
    after = _run("failed-backward")
    assert after["error"] == "out of memory while reducing a gradient"
    assert after["installs_left"] == 0 and after["changed"] == []
    assert alone["mlp"] == after["mlp"]


@pytest.mark.parametrize("what", ["select", "move"])
def test_a_moved_internal_is_one_clear_line(what):
    found = _run("moved", what)
    assert found["error"].startswith("DTensorInternalsError: this torch (")
    assert "; fix: " in found["error"] and found["changed"] == []
