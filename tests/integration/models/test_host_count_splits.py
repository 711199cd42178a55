"""JetMoE splits the routed tokens by counts read on the host, inside its experts' module.

Its router counts the tokens per expert and hands them on as Python ints
(``expert_size.tolist()``); ``JetMoeParallelExperts`` then splits its input by them. The
split has data-dependent sizes, so the experts' module is an opaque region
(``trace/opaque.py``), and the sizes it is handed are answered zero on fake tensors: the
split of 256 rows by ``[0, 0, 0, 0]`` failed the trace. The first piece now takes what
the answered sizes leave, and JetMoE plans, steps and matches one device.
"""

import pytest
from conftest import ROOT
from zoo import forced_plan, verify_on_fake_world

import autoplan
from autoplan.model_file import import_model_file
from autoplan.verify.numerics import NumericsJob, build_seeded, check_numerics, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")
EXPERTS = [f"model.layers.{i}.{block}.{linear}" for i in range(2) for block in ("mlp", "self_attention.experts")
           for linear in ("input_linear", "output_linear")]


@pytest.mark.slow  # plans and steps the model on a fake process group
def test_plans_with_its_experts_opaque_and_a_step_runs_the_predicted_collectives():
    models = import_model_file(MODEL_FILE)
    plan = autoplan.suggest(build_seeded(models, "jetmoe", 0), seeded_batch(models, 1), mesh=MESH, axis_names=AXIS_NAMES)
    assert sorted(plan.opaque_modules) == sorted(EXPERTS)
    result = verify_on_fake_world(build_seeded(models, "jetmoe", 0), seeded_batch(models, 1), plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.gloo
def test_a_plan_that_shards_matches_one_device_on_gloo():
    # The counts are read from the whole batch's routing, split over the mesh: on a fake
    # process group a collective carries no data, so only real ranks give the counts.
    plan = forced_plan(f"{MODEL_FILE}:jetmoe", MESH, AXIS_NAMES)
    assert any(p.startswith("S(") for spec in plan.parameters.values() for p in spec)
    result, = check_numerics([NumericsJob(str(MODEL_FILE), "jetmoe", plan.to_json())], world=8)
    assert result.loss <= 1e-5, result.loss
    assert max(result.gradients.values()) <= 1e-5, result.gradients
