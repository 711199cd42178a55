"""Progress on long work: a live status line on a terminal's stderr, nothing otherwise."""

import io
import re
import sys
import time

from conftest import EXAMPLES

from autoplan.explain.progress import progress_on_stderr, rows_on_stderr
from autoplan.model_file import load_model_file
from autoplan.pipeline.suggest import suggest_with_report


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
        # the MLP's data-parallel step all-reduces its loss, which the ILP does not price
        # (over 1 % of this small step): a second candidate is solved and priced by its step
        "pricing other candidate plans by their step",
    ]


def test_benchmark_rows_show_on_a_terminal_and_nothing_on_a_pipe():
    pipe = io.StringIO()
    with rows_on_stderr(3, stream=pipe) as rows:
        rows.started("gpt2-8")
        rows.finished("gpt2-8")
    assert pipe.getvalue() == ""
    terminal = _Terminal()
    with rows_on_stderr(3, stream=terminal) as rows:
        rows.finished("gpt2-8")
        rows.started("llama-2x4-lean")
        time.sleep(0.3)  # rich refreshes the bar several times a second
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())  # the terminal's colour codes
    assert "1/3 rows" in shown and "llama-2x4-lean" in shown and "0:00:00" in shown


def test_benchmark_output_during_the_bar_is_printed_whole_above_it(capsys, monkeypatch):
    # what a benchmark writes to stderr while the bar is up goes through the bar's console:
    # whole lines, never spliced into the bar's line
    terminal = _Terminal()
    with rows_on_stderr(2, stream=terminal) as rows:
        rows.started("bert-8")
        print("bert-8: +1.5%", file=sys.stderr)
        rows.finished("bert-8")
    assert "bert-8: +1.5%\n" in terminal.getvalue()
    assert capsys.readouterr().err == ""
    # and so does stdout when it is the terminal too; redirected, it keeps its rows
    for stdout, through_bar in ((_Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stdout", stdout)
        terminal = _Terminal()
        with rows_on_stderr(2, stream=terminal) as rows:
            print("bert | 1.5")
            rows.finished("bert-8")
        assert ("bert | 1.5\n" in terminal.getvalue()) == through_bar
        assert (stdout.getvalue() == "bert | 1.5\n") != through_bar


def test_plain_progress_writes_one_line_per_stage_and_row_even_to_a_pipe(monkeypatch):
    """``AUTOPLAN_PROGRESS=plain``: a log gets one line per stage and per row done, with the
    time so far; ``off`` silences a terminal too."""
    monkeypatch.setenv("AUTOPLAN_PROGRESS", "plain")
    pipe = io.StringIO()
    with progress_on_stderr(pipe) as say:
        say("tracing the model")
        say("solving 2/24: model.layers.0-15 as fsdp")
    lines = pipe.getvalue().splitlines()
    assert [re.sub(r"\[\d+:\d\d:\d\d\]", "[T]", line) for line in lines] == [
        "autoplan: [T] tracing the model", "autoplan: [T] solving 2/24: model.layers.0-15 as fsdp",
    ]
    pipe = io.StringIO()
    with rows_on_stderr(3, "models", stream=pipe) as rows:
        rows.started("gpt2-8")
        rows.finished("gpt2-8")
        rows.finished("bert-8")
    assert [line.split("] ", 1)[1] for line in pipe.getvalue().splitlines()] == [
        "1/3 models: gpt2-8 done", "2/3 models: bert-8 done",
    ]
    monkeypatch.setenv("AUTOPLAN_PROGRESS", "off")
    terminal = _Terminal()
    with progress_on_stderr(terminal) as say, rows_on_stderr(2, stream=terminal) as rows:
        assert say is None
        rows.finished("gpt2-8")
    assert terminal.getvalue() == ""
