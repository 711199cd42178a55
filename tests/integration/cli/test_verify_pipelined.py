"""``autoplan verify --numerics`` on a plan with pipeline stages: the step runs on one gloo
process per device (pp 2 x tp 2, 1F1B, on 4), its counts checked per rank and its loss and
gradients against one device."""

import dataclasses

import pytest
from conftest import ROOT

import autoplan
from autoplan.cli import main
from autoplan.model_file import load_model_file
from autoplan.plan.pipeline_plan import PipelinePlan, Stage

LLAMA = str(ROOT / "tests" / "models" / "pipeline_llama.py")
LAYERS = [f"model.layers.{i}" for i in range(8)]


@pytest.mark.slow
@pytest.mark.gloo
def test_cli_verify_numerics_on_a_pipelined_plan(tmp_path, capsys):
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2,), axis_names=("tp",), cache=False)
    stages = (Stage(("model.embed_tokens", *LAYERS[:3]), 0), Stage((*LAYERS[3:], "model.norm", "lm_head"), 1))
    plan = dataclasses.replace(plan, pipeline=PipelinePlan("pp", 2, 0, "1F1B", 2, stages))
    path = tmp_path / "pipelined.json"
    plan.save(path)
    assert main(["verify", LLAMA, str(path), "--numerics"]) == 0
    out = capsys.readouterr().out
    assert "1F1B, 2 stages on 2 pipeline ranks, 2 microbatches" in out
    assert out.count("collectives: passed") == 2  # one table per pipeline rank
    assert "numerics on 4 gloo processes" in out and "(ok)" in out
