"""``autoplan suggest --context-axis``: the tiny Llama at 4096 tokens planned with its sequence
split over a 4-rank axis and without; the cheaper is kept, and ``show`` names the layout."""

import json

import pytest
from conftest import EXAMPLES

from autoplan import Plan
from autoplan.cli import main


@pytest.mark.slow  # plans twice, seconds each
def test_suggest_with_a_context_axis_keeps_the_cheaper_and_names_it(tmp_path, capsys):
    out, stats = tmp_path / "plan.json", tmp_path / "stats.json"
    args = ["suggest", str(EXAMPLES / "llama_context.py"), "--mesh", "4", "--axis-names", "cp", "--context-axis", "cp",
            "--profile", "cpu-gloo", "--out", str(out), "--stats", str(stats)]
    assert main(args) == 0
    text = capsys.readouterr().out
    figures = json.loads(stats.read_text())
    plan = Plan.load(out)
    # At 4096 tokens and hidden 64, attention is most of the step: splitting it wins.
    assert figures["kept"] == "context" and figures["context_step_s"] < figures["plain_step_s"]
    layout = plan.context_parallel
    assert layout is not None and (layout.axis, layout.size, layout.load_balance) == ("cp", 4, "head_tail")
    assert layout.alternative_step_s == figures["plain_step_s"]
    assert "[1]['attention_mask']" not in layout.sequence_inputs  # the mask of ones stays whole
    assert plan.predicted.step_time_s == figures["context_step_s"]
    assert "context parallel (the sequence split over a mesh axis)" in text
    assert "without the sequence split the best plan predicts" in text
    # the keys' and values' all-gathers and their gradients' reduce-scatters, priced on cp
    kinds = plan.predicted.collectives["cp"]
    assert kinds["all_gather"]["count"] >= 4 and kinds["reduce_scatter"]["count"] >= 4


def test_an_unknown_context_axis_is_a_one_line_error(capsys):
    code = main(["suggest", str(EXAMPLES / "llama_context.py"), "--mesh", "4", "--axis-names", "dp", "--context-axis", "cp",
                 "--out", "/nonexistent/never.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "context axis 'cp'" in err[0]


@pytest.mark.slow  # plans, then explain solves an alternative per block
def test_explain_score_and_verify_take_a_context_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    model = str(EXAMPLES / "llama_context.py")
    assert main(["suggest", model, "--mesh", "4", "--axis-names", "cp", "--context-axis", "cp", "--profile", "cpu-gloo",
                 "--out", str(out)]) == 0
    plan = Plan.load(out)
    capsys.readouterr()
    assert main(["explain", model, str(out)]) == 0
    text = capsys.readouterr().out
    # scored with the context axis's attention: the plan's own price, as suggest gave it
    assert f"the plan: {plan.predicted.step_time_s * 1e3:.3f} ms per step" in text
    assert "keys and values of" in text and "all_gather on cp, reduce_scatter on cp (backward)" in text
    assert "context parallel (the sequence split over a mesh axis)" in text
    # score prices it as suggest did, and verify counts the collectives it predicted
    assert main(["score", model, str(out)]) == 0
    assert f"the plan file's own prediction: {plan.predicted.step_time_s * 1e3:.3f} ms" in capsys.readouterr().out
    assert main(["verify", model, str(out)]) == 0
    text = capsys.readouterr().out
    assert "collectives: passed" in text and "reduce_scatter" in text
