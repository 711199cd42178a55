"""The planner's pipelined plan runs as it predicts (issue 47, end to end): ``autoplan.suggest``
on a Llama of eight layers with axis names (pp, dp, tp) on 2 x 2 x 2, under a memory budget
that makes the layout shard weights on both stage-mesh axes, then its step on 8 gloo
processes: loss and every gradient within 1e-5 of one device, and every rank's collectives
and point-to-point sends and receives the counts ``predicted_counts_on_cpu`` makes of the plan's own
prediction (``predicted.module_collectives``: the layout's, for one microbatch). From the
CLI, ``suggest --axis-names pp,dp,tp`` writes a plan that ``verify --numerics`` passes and
``export --format torch`` turns into torchtitan's pipeline settings.

With the default budget the tiny model's layout keeps everything whole (no collective but
the sends), which would prove little; ``SHARDING_SHARE`` of that plan's peak makes it shard.
"""

import functools
import runpy

import pytest
from conftest import ROOT

import autoplan
from autoplan.cli import main
from autoplan.model_file import load_model_file
from autoplan.plan.module_plan import Plan
from autoplan.verify.numerics import NumericsJob, check_numerics
from autoplan.verify.pipeline_counts import p2p_counts, pipeline_rank_of, predicted_counts_on_cpu, without_bytes
from autoplan.verify.step_check import compare

TOLERANCE = 1e-5
LLAMA = str(ROOT / "tests" / "models" / "pipeline_llama.py")
MESH, AXES = (2, 2, 2), ("pp", "dp", "tp")
SHARDING_SHARE = 3 / 8
"""Of the default budget's predicted peak: low enough that weights are sharded on dp and tp."""


@functools.cache  # the same question in both tests that take it: solved once per process
def sharding_budget_gib() -> float:
    loaded = load_model_file(LLAMA)
    free = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXES, cache=False)
    return SHARDING_SHARE * free.predicted.peak_memory_bytes / 2**30


def sharded_axes(plan: Plan) -> set[str]:
    return {axis for spec in plan.parameters.values() for axis, p in zip(plan.axis_names, spec) if p.startswith("S(")}


@pytest.mark.slow
@pytest.mark.gloo
def test_suggested_pipeline_matches_one_device_and_its_prediction():
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXES,
                            memory_gib=sharding_budget_gib(), cache=False)
    assert plan.pipeline is not None and plan.pipeline.axis == "pp"
    assert sharded_axes(plan) == {"dp", "tp"}, "the budget no longer makes the layout shard weights on both axes"
    assert plan.predicted.collectives.get("tp") and plan.predicted.collectives.get("dp"), plan.predicted.collectives
    (result,) = check_numerics([NumericsJob(LLAMA, "build_model", plan.to_json())], world=8)
    print(f"{plan.pipeline.schedule}, {len(plan.pipeline.stages)} stages, {plan.pipeline.microbatches} microbatches: "
          f"loss error {result.loss:.3g}, worst gradient error {result.worst:.3g} ({result.worst_name})")
    assert len(result.gradients) == len(plan.parameters), "a parameter's gradient was not compared"
    assert result.loss <= TOLERANCE, result.loss
    assert result.worst <= TOLERANCE, (result.worst_name, result.worst)
    ran_layout = False
    for rank, observed in enumerate(result.counts):
        verification = compare(predicted_counts_on_cpu(plan, pipeline_rank_of(plan, rank)), without_bytes(observed))
        assert verification.passed and not verification.moved, f"rank {rank}:\n{verification.summary(all_rows=True)}"
        sends = p2p_counts(observed, "pp")
        assert sends["send"] == sends["recv"] > 0, sends
        ran_layout |= any(axis != "pp" for per_axis in observed.values() for axis in per_axis)
    assert ran_layout, "no rank ran a collective of the layout: the counts compared only the sends"


@pytest.mark.slow
@pytest.mark.gloo
def test_cli_suggest_verify_and_export_a_pipelined_plan(tmp_path, capsys):
    path = tmp_path / "llama_pp.json"
    assert main(["suggest", LLAMA, "--mesh", "2x2x2", "--axis-names", "pp,dp,tp",
                 "--memory-gib", f"{sharding_budget_gib():.6g}", "--out", str(path)]) == 0
    plan = Plan.load(path)
    assert plan.pipeline is not None and sharded_axes(plan) == {"dp", "tp"}
    capsys.readouterr()
    assert main(["verify", LLAMA, str(path), "--numerics"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert out.count("collectives: passed") == plan.pipeline.size  # one table per pipeline rank
    assert "numerics on 8 gloo processes" in out and "(ok)" in out
    assert main(["verify", LLAMA, str(path)]) == 0
    capsys.readouterr()
    assert main(["score", LLAMA, str(path), "--mesh", "2x2x2"]) == 0  # the full mesh, pp axis included
    out = capsys.readouterr().out
    assert f"predicted step time {plan.predicted.step_time_s * 1e3:.3f} ms" in out, out  # its own prediction
    assert f"pipeline: {plan.pipeline.schedule} on pp 2 x dp 2 x tp 2" in out, out
    exported = tmp_path / "llama_pp_torch.py"
    assert main(["export", str(path), "--format", "torch", "--out", str(exported)]) == 0
    settings = runpy.run_path(str(exported))["TORCHTITAN_PARALLELISM"]
    pipeline = plan.pipeline
    assert settings["pipeline_parallel_degree"] == pipeline.size
    assert settings["pipeline_parallel_schedule"] == pipeline.schedule
    assert settings["module_fqns_per_model_part"] == [list(stage.modules) for stage in pipeline.stages]


@pytest.mark.slow
@pytest.mark.gloo
def test_one_stage_pipeline_accumulates_gradients_as_predicted():
    """A pp axis of size 1: the planner's pipeline of one stage (gradient accumulation over
    its microbatches) on dp 2 x tp 2 runs on 4 gloo processes as one device does, with the
    predicted counts (the dp group is named dp, not pp+dp, though a pp of 1 makes them one)."""
    loaded = load_model_file(LLAMA)
    mesh = (1, 2, 2)
    free = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=mesh, axis_names=AXES, cache=False)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=mesh, axis_names=AXES, cache=False,
                            memory_gib=SHARDING_SHARE * free.predicted.peak_memory_bytes / 2**30)
    assert plan.pipeline is not None and plan.pipeline.size == 1 and len(plan.pipeline.stages) == 1
    assert plan.pipeline.microbatches > 1, plan.pipeline
    assert plan.predicted.module_collectives, "the layout's collectives are not predicted"
    (result,) = check_numerics([NumericsJob(LLAMA, "build_model", plan.to_json())], world=4)
    print(f"one stage, {plan.pipeline.microbatches} microbatches: loss error {result.loss:.3g}, "
          f"worst gradient error {result.worst:.3g} ({result.worst_name})")
    assert result.loss <= TOLERANCE and result.worst <= TOLERANCE, (result.worst_name, result.worst)
    for rank, observed in enumerate(result.counts):
        verification = compare(predicted_counts_on_cpu(plan, pipeline_rank_of(plan, rank)), without_bytes(observed))
        assert verification.passed and not verification.moved, f"rank {rank}:\n{verification.summary(all_rows=True)}"
        assert p2p_counts(observed, "pp") == {"send": 0, "recv": 0}


@pytest.mark.slow
def test_devices_with_axes_of_one_plan():
    """``suggest(devices=2)`` prices meshes with axes of size 1 (pp 2 x dp 1 x tp 1, ...): the
    chosen plan's mesh holds no axis of size 1 but where it is the only one, so no placement
    stacks shards over one (a strided shard over a size-1 axis failed the plan's checks)."""
    loaded = load_model_file(LLAMA)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, devices=2)
    assert plan.mesh_shape == (1,) or 1 not in plan.mesh_shape, plan.mesh_shape
    Plan.from_dict(plan.to_dict())
