"""A plan run on the wrong model: the fix names the command being run.

``evaluate/score.py``'s ``check_plan_for_model`` is shared by ``score``, ``verify``,
``explain`` and ``report``; its one line used to say "score the model the plan was made
for" whichever of them the user ran.
"""

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.evaluate.score import check_plan_for_model
from autoplan.model_file import load_model_file

MLP = str(EXAMPLES / "mlp.py")
LLAMA = str(EXAMPLES / "llama.py")


@pytest.fixture(scope="module")
def mlp_plan_file(tmp_path_factory):
    loaded = load_model_file(MLP)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2,), axis_names=("dp",), profile="cpu-gloo",
                            cache=False, broadcast=False)
    return plan, str(plan.save(tmp_path_factory.mktemp("plans") / "mlp.json"))


@pytest.mark.parametrize("command", ["score", "verify", "explain"])
def test_the_fix_names_the_command_being_run(mlp_plan_file, command, capsys):
    _, path = mlp_plan_file
    assert main([command, LLAMA, path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the plan does not match the model" in err[0], err
    assert f"fix: {command} the model the plan was made for" in err[0], err
    others = {"score", "verify", "explain"} - {command}
    assert not any(f"fix: {other} " in err[0] for other in others), err


def test_the_api_says_what_it_was_asked(mlp_plan_file):
    plan, _ = mlp_plan_file
    llama = load_model_file(LLAMA)
    with pytest.raises(PlanError, match="fix: score the model the plan was made for"):
        autoplan.score(llama.model, llama.example_inputs, plan)
    with pytest.raises(PlanError, match="fix: report the model the plan was made for"):
        check_plan_for_model(llama.model, llama.example_inputs, plan, command="report")
