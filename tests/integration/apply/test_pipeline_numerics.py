"""Plans with pipeline stages on gloo (issue 47, Must-show 1): one training step of the
schedule gives one device's loss and gradients within 1e-5 (relative, as the zoo's numerics),
and on every rank runs the collectives and point-to-point sends and receives the plan
predicts (``verify/pipeline_counts.py``: the layout's collectives once per microbatch for
the rank's modules; one send and one receive per microbatch and stage boundary each way).

The layout is planned on the stage mesh under a budget that makes it shard weights
(``zoo.forced_plan``), then cut into stages by hand (the planner's stage split is not this
test's subject): pp 2 x dp 2 x tp 2 on 8 processes with 1F1B, and pp 4 x tp 2 with
Interleaved1F1B, two stages per rank, on a Llama of eight layers. Each job runs in its own
launch of 8 gloo processes on 127.0.0.1. The other schedules a plan may name (GPipe and
the zero-bubble ones, whose V places two neighbouring stages on one rank) run on pp 2 x
tp 2, in one launch of 4.
"""

import dataclasses

import pytest
from conftest import ROOT
from zoo import forced_plan

import autoplan
from autoplan.model_file import load_model_file
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import PipelinePlan, Stage
from autoplan.verify.numerics import NumericsJob, check_numerics
from autoplan.verify.pipeline_counts import p2p_counts, predicted_counts_on_cpu, without_bytes
from autoplan.verify.step_check import compare

TOLERANCE = 1e-5
LLAMA = str(ROOT / "tests" / "models" / "pipeline_llama.py")
LAYERS = [f"model.layers.{i}" for i in range(8)]


def pipelined(stage_mesh, axis_names, pipeline: PipelinePlan) -> Plan:
    plan = forced_plan(LLAMA, stage_mesh, axis_names)
    assert any(p.startswith("S(") for spec in plan.parameters.values() for p in spec), "the forced plan shards nothing"
    return Plan.from_dict(dataclasses.replace(plan, pipeline=pipeline).to_dict())  # through the schema and its checks


def one_f_one_b() -> Plan:
    stages = (Stage(("model.embed_tokens", *LAYERS[:4]), 0), Stage((*LAYERS[4:], "model.norm", "lm_head"), 1))
    return pipelined((2, 2), ("dp", "tp"), PipelinePlan("pp", 2, 0, "1F1B", 4, stages))


def interleaved() -> Plan:
    modules = [("model.embed_tokens", LAYERS[0]), *((layer,) for layer in LAYERS[1:7]), (LAYERS[7], "model.norm", "lm_head")]
    stages = tuple(Stage(m, i % 4) for i, m in enumerate(modules))
    return pipelined((2,), ("tp",), PipelinePlan("pp", 4, 0, "Interleaved1F1B", 4, stages))


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.parametrize("build", [one_f_one_b, interleaved], ids=["pp2xdp2xtp2-1F1B", "pp4xtp2-Interleaved1F1B"])
def test_pipelined_step_matches_one_device(build):
    plan = build()
    (result,) = check_numerics([NumericsJob(LLAMA, "build_model", plan.to_json())], world=8)
    worst = max(result.gradients.items(), key=lambda kv: kv[1])
    print(f"{build.__name__}: loss error {result.loss:.3g}, worst gradient error {worst[1]:.3g} ({worst[0]})")
    assert len(result.gradients) == len(plan.parameters), "a parameter's gradient was not compared"
    assert result.loss <= TOLERANCE, result.loss
    assert worst[1] <= TOLERANCE, worst
    per_pipeline_rank = 8 // plan.pipeline.size
    for rank, observed in enumerate(result.counts):
        pp_rank = rank // per_pipeline_rank  # the pipeline axis is the mesh's first
        verification = compare(predicted_counts_on_cpu(plan, pp_rank), without_bytes(observed))
        assert verification.passed and not verification.moved, f"rank {rank}:\n{verification.summary(all_rows=True)}"
        sends = p2p_counts(observed, "pp")
        assert sends["send"] == sends["recv"] > 0, sends


def _on_pp2_tp2(schedule: str, ranks: tuple[int, ...]) -> Plan:
    loaded = load_model_file(LLAMA)
    layout = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2,), axis_names=("tp",), cache=False)
    cuts = [("model.embed_tokens", *LAYERS[:4]), (*LAYERS[4:], "model.norm", "lm_head")] if len(ranks) == 2 else \
        [("model.embed_tokens", *LAYERS[:2]), LAYERS[2:4], LAYERS[4:6], (*LAYERS[6:], "model.norm", "lm_head")]
    stages = tuple(Stage(tuple(modules), rank) for modules, rank in zip(cuts, ranks))
    return dataclasses.replace(layout, pipeline=PipelinePlan("pp", 2, 0, schedule, 4, stages))


@pytest.mark.slow
@pytest.mark.gloo
def test_gpipe_and_zero_bubble_schedules_match_one_device():
    plans = {"GPipe": _on_pp2_tp2("GPipe", (0, 1)), "ZBVZeroBubble": _on_pp2_tp2("ZBVZeroBubble", (0, 1, 1, 0)),
             "InterleavedZeroBubble": _on_pp2_tp2("InterleavedZeroBubble", (0, 1, 0, 1))}
    results = check_numerics([NumericsJob(LLAMA, "build_model", plan.to_json()) for plan in plans.values()], world=4)
    for (schedule, plan), result in zip(plans.items(), results):
        print(f"{schedule}: loss error {result.loss:.3g}, worst gradient error {result.worst:.3g} ({result.worst_name})")
        assert result.loss <= TOLERANCE and result.worst <= TOLERANCE, (schedule, result.worst_name, result.worst)
        for rank, observed in enumerate(result.counts):
            verification = compare(predicted_counts_on_cpu(plan, rank // 2), without_bytes(observed))
            assert verification.passed and not verification.moved, f"{schedule} rank {rank}:\n{verification.summary(all_rows=True)}"
