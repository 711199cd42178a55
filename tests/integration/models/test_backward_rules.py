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

    # The plan before any step: the fixture's, made (through the run's plan cache) before this
    # process stepped any plan; one solve of the same question fewer than planning it here again.
    before = plans["poolformer", "default"]
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


def test_a_bias_free_convolution_backward_runs_on_a_2d_mesh_while_installed():
    """A convolution without bias asks its backward for no bias gradient. Torch 2.14's
    DTensor refuses its own rule for that on a 2-D mesh (the rows lay the bias gradient out
    ``Partial`` where the all-replicate row leaves it ``None``); torch 2.13's runs it.
    Asked of DTensor alone, ``refuses_mixed_outputs`` says which; with autoplan's changes
    installed the backward runs on either, making exactly the gradients asked for."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.dtensor.masked_outputs import refuses_mixed_outputs

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", MESH, mesh_dim_names=AXIS_NAMES)
        whole = [Replicate(), Replicate()]
        grad, image, weight = (
            distribute_tensor(torch.randn(*shape), mesh, whole) for shape in ((8, 16, 1, 1), (8, 4, 1, 1), (16, 4, 1, 1))
        )
        args = (grad, image, weight, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
        try:
            aten.convolution_backward.default(*args)
            refused = False
        except (AssertionError, RuntimeError) as err:  # DTensor wraps its rule's refusal
            refused = "mixes None" in str(err)
            assert refused, err
        assert refuses_mixed_outputs() == refused
        with overrides.installed():
            grad_input, grad_weight, grad_bias = aten.convolution_backward.default(*args)
        assert grad_bias is None
        assert tuple(grad_input.shape) == (8, 4, 1, 1) and tuple(grad_weight.shape) == (16, 4, 1, 1)
        assert grad_input.placements == tuple(whole) and grad_weight.placements == tuple(whole)
    finally:
        dist.destroy_process_group()
