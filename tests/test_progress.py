"""Progress on long work: a live status line on a terminal's stderr, nothing otherwise."""

import io
import time

from autoplan.explain.progress import progress_on_stderr
from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report
from conftest import EXAMPLES


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_status_line_and_a_pipe_nothing():
    pipe = io.StringIO()
    with progress_on_stderr(pipe) as say:
        assert say is None
    assert pipe.getvalue() == ""
    terminal = _Terminal()
    with progress_on_stderr(terminal) as say:
        say("solving the ILP")
        time.sleep(0.3)  # rich refreshes the line several times a second
    assert "solving the ILP" in terminal.getvalue()


def test_planning_reports_each_stage_as_it_starts():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    heard = []
    suggest_with_report(loaded.model, loaded.example_inputs, (2, 4), progress=heard.append)
    assert heard == [
        "tracing the model", "building the placement choices", "costing the choices",
        "merging followers", "solving the ILP", "writing the plan",
    ]
