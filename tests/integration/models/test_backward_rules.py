"""Backward ops DTensor has no rule for: a rule where the op is elementwise, else the
forward planned replicated and the backward run replicated (``dtensor/rules.py``,
``choices/graph.backward_without_rule``).

Each model (``tests/models/backward_rules.py``) is planned on 2x4 with the default budget and
with one that forces sharding, runs a step on a fake process group with exactly the
predicted collectives, and matches one device on 8 gloo processes.
"""

from pathlib import Path

import pytest
import torch
from conftest import ROOT
from zoo import forced_plan, verify_on_fake_world

import autoplan
from autoplan.choices.graph import backward_without_rule
from autoplan.dtensor import overrides
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import NumericsJob, build_seeded, check_numerics, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "backward_rules.py"
MODELS = ("mobilenet_v2", "poolformer")
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")
aten = torch.ops.aten


def test_which_backward_ops_lack_a_rule():
    with overrides.installed():
        assert not backward_without_rule(aten.hardtanh.default)  # elementwise: autoplan's rule
        assert backward_without_rule(aten.avg_pool2d.default)
        assert backward_without_rule(aten.native_group_norm.default)
        assert not backward_without_rule(aten.mm.default)  # no backward op of its own
        assert not backward_without_rule(aten.embedding.default)  # composite: DTensor sees embedding_dense_backward


@pytest.fixture(scope="module")
def plans():
    found = {}
    for name in MODELS:
        loaded = load_model_file(f"{MODEL_FILE}:{name}")
        found[name, "default"] = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES)
        found[name, "forced"] = forced_plan(f"{MODEL_FILE}:{name}", MESH, AXIS_NAMES)
    return found


@pytest.mark.slow  # plans two models three times each
@pytest.mark.parametrize("budget", ["default", "forced"])
@pytest.mark.parametrize("name", MODELS)
def test_a_step_runs_the_predicted_collectives(plans, name, budget):
    plan = plans[name, budget]
    module = import_model_file(Path(MODEL_FILE))
    result = verify_on_fake_world(build_seeded(module, name, 0), seeded_batch(module, 1), plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.slow  # plans a model twice, steps another plan between
def test_a_planned_step_leaves_the_next_plan_unchanged(plans):
    """A plan's replicate fallback rules are in force while its model runs, not after: a
    process that steps a plan and then plans again (the coverage benchmark plans the
    forcing budget after stepping the default plan) finds the same ops without a rule and
    makes the same plan. Before, the fallback rules stayed in DTensor's registry for every
    later install: the second plan listed no fallback ops and ran other collectives."""

    def plan_poolformer():
        loaded = load_model_file(f"{MODEL_FILE}:poolformer")
        return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, cache=False)

    before = plan_poolformer()
    module = import_model_file(Path(MODEL_FILE))
    verify_on_fake_world(build_seeded(module, "poolformer", 0), seeded_batch(module, 1), plans["poolformer", "forced"])
    after = plan_poolformer()
    assert set(after.fallback_ops) == {"aten.avg_pool2d.default", "aten.native_group_norm.default"}
    assert after.to_json() == before.to_json()
    with overrides.installed():
        assert backward_without_rule(aten.native_group_norm.default)


def test_only_ops_whose_backward_has_no_rule_run_replicated(plans):
    assert plans["mobilenet_v2", "default"].fallback_ops == ()
    assert set(plans["poolformer", "default"].fallback_ops) == {"aten.avg_pool2d.default", "aten.native_group_norm.default"}


@pytest.mark.gloo
def test_forced_plans_match_one_device_on_gloo(plans):
    jobs = [NumericsJob(str(MODEL_FILE), name, plans[name, "forced"].to_json()) for name in MODELS]
    for name, result in zip(MODELS, check_numerics(jobs, world=8)):
        assert result.loss <= 1e-5, (name, result.loss)
        worst = max(result.gradients.items(), key=lambda item: item[1])
        assert worst[1] <= 1e-5, (name, worst)
