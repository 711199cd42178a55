"""Every public-zoo model's tiny config on a 2x4 gloo run (8
processes on 127.0.0.1) gives the single-device model's loss, gradients and buffers.

Each model is planned under a memory budget its unconstrained plan exceeds (half of the
model state must be sharded away), so the plan really distributes weights. All models run
in one launch of 8 processes. Tolerance: relative error <= 1e-5 in float32 for every
model (gradients that are zero in exact arithmetic are judged against a floor, see
``autoplan.verify.numerics``). The hard cases run too: a Llama with 2 kv heads and a 50257 vocab
on tp 4, Mixtral with its default grouped experts, a plain-PyTorch mixture-of-experts with
a data-dependent region, and an op DTensor has no rule for.
"""

import pytest
from conftest import ROOT
from zoo import HARD_CASES, PUBLIC_ZOO, example_path, forced_plan

from autoplan.verify.numerics import NumericsJob, check_numerics

TOLERANCE = 1e-5
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")
RENORM = str(ROOT / "tests" / "models" / "renorm_mlp.py")
LOOP_MOE = str(ROOT / "tests" / "models" / "loop_moe.py")


@pytest.fixture(scope="module")
def results():
    paths = {name: example_path(name) for name in PUBLIC_ZOO + HARD_CASES}
    paths["renorm_mlp"] = RENORM
    paths["loop_moe"] = LOOP_MOE
    plans = {name: forced_plan(path, MESH, AXIS_NAMES) for name, path in paths.items()}
    jobs = [NumericsJob(paths[name], "build_model", plans[name].to_json()) for name in paths]
    outcome = check_numerics(jobs, world=8)
    return plans, dict(zip(paths, outcome))


@pytest.mark.gloo
@pytest.mark.parametrize("name", PUBLIC_ZOO + HARD_CASES + ("renorm_mlp", "loop_moe"))
def test_matches_single_device(results, name):
    plans, outcome = results
    sharded = [fqn for fqn, spec in plans[name].parameters.items() if any(p.startswith("S(") for p in spec)]
    assert sharded, f"{name}: the forced plan shards nothing"
    result = outcome[name]
    worst = max(result.gradients.items(), key=lambda kv: kv[1])
    assert result.loss <= TOLERANCE, result.loss
    assert worst[1] <= TOLERANCE, worst
    assert all(v <= TOLERANCE for v in result.buffers.values()), result.buffers


@pytest.mark.gloo
def test_uncovered_op_is_planned_replicated_and_named(results):
    plans, _ = results
    plan = plans["renorm_mlp"]
    assert plan.fallback_ops == ("aten.renorm.default",)
    assert any("aten.renorm.default" in w for w in plan.warnings)
