"""``export --format torch`` of a plan with pipeline stages writes what torchtitan's
``[parallelism]`` config needs: degree, schedule, microbatch size, each stage's module FQNs
(and the older split points), beside the stage's layout."""

import dataclasses
import math

from conftest import ROOT

import autoplan
from autoplan.cli import main
from autoplan.interop.export_torch import export_torch
from autoplan.model_file import load_model_file
from autoplan.plan.pipeline_plan import PipelinePlan, Stage

LLAMA = str(ROOT / "tests" / "models" / "pipeline_llama.py")
LAYERS = [f"model.layers.{i}" for i in range(8)]


def test_pipelined_plan_exports_torchtitans_pipeline_settings(tmp_path, capsys):
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 2), axis_names=("dp", "tp"), cache=False)
    first, last = ("model.embed_tokens", *LAYERS[:5]), (*LAYERS[5:], "model.norm", "lm_head")
    plan = dataclasses.replace(plan, pipeline=PipelinePlan("pp", 2, 0, "1F1B", 2, (Stage(first, 0), Stage(last, 1))))
    # rows per microbatch on one rank: 8 rows over 2 microbatches over the axes splitting the batch
    placements = plan.inputs["[1]['input_ids']"].placements
    rows = 8 // 2 // math.prod(size for size, p in zip(plan.mesh_shape, placements) if p == "S(0)")
    namespace: dict = {}
    exec(export_torch(plan, "pipelined.json").source, namespace)  # the generated module, run as a user imports it
    assert namespace["TORCHTITAN_PARALLELISM"] == {
        "pipeline_parallel_degree": 2,
        "pipeline_parallel_schedule": "1F1B",
        "pipeline_parallel_microbatch_size": rows,
        "module_fqns_per_model_part": [list(first), list(last)],
    }
    assert namespace["PIPELINE_SPLIT_POINTS"] == ["model.layers.5"]
    assert namespace["FULL_MESH_SHAPE"] == (2, 2, 2) and namespace["FULL_AXIS_NAMES"] == ("pp", "dp", "tp")
    assert namespace["MESH_SHAPE"] == (2, 2)  # parallelize() lays out one stage on its dp x tp mesh
    path = tmp_path / "pipelined.json"
    plan.save(path)
    assert main(["export", str(path), "--format", "torch", "--out", str(tmp_path / "out.py")]) == 0
    assert "pipeline on pp: 2 ranks, 1F1B, 2 microbatches, stages start at" in capsys.readouterr().out
