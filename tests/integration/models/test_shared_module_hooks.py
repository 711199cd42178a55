"""A module object that other models hold too runs for them as before once a plan is applied.

OpenAI-GPT's MLPs take their activation from transformers' module-level ``ACT_FNS``, a dict
of module instances: every OpenAI-GPT built in the process holds the same GELU module.
``apply_plan`` hooks the modules the plan lays out, that one among them, and the hooks
acted wherever the module ran: a second model, planned after the first had trained a
step, failed at its trace ("aten.addmm.default got mixed torch.Tensor and DTensor"), its
activation's output made a DTensor. The hooks act only inside the planned model's calls.
"""

import torch
from conftest import ROOT
from torch.distributed.tensor import DTensor
from zoo import verify_on_fake_world

import autoplan
from autoplan.model_file import import_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


def test_a_model_sharing_a_module_with_a_planned_one_plans_and_runs_as_before():
    models = import_model_file(MODEL_FILE)
    batch = seeded_batch(models, 1)
    first = build_seeded(models, "openai_gpt", 0)
    plan = autoplan.suggest(first, batch, mesh=MESH, axis_names=AXIS_NAMES)
    shared = first.transformer.h[0].mlp.act
    assert any(fqn.endswith("mlp.act") for fqn in plan.modules), "the plan no longer lays out the activation"
    result = verify_on_fake_world(first, batch, plan)
    assert result.passed, "\n" + result.summary()

    second = build_seeded(models, "openai_gpt", 0)
    assert second.transformer.h[0].mlp.act is shared
    loss = _seeded_loss(second, batch)
    assert not isinstance(loss, DTensor)
    assert torch.equal(loss, _seeded_loss(build_seeded(models, "openai_gpt", 0), batch))
    again = autoplan.suggest(second, batch, mesh=MESH, axis_names=AXIS_NAMES)
    assert again.to_json() == plan.to_json()


def _seeded_loss(model, batch):
    torch.manual_seed(0)  # the same dropout masks
    return model(**batch).loss
