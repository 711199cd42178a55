"""Tensors a model holds or builds outside the fake mode, as its code puts them, trace.

- XLM's encoder builds a key/value cache whatever its config says, and asserts on the
  longest sequence read from the batch, which makes the encoder an opaque region
  (``trace/opaque.py``). The cache's first keys are ``torch.tensor([])`` on the input's
  device, a plain meta tensor that ``torch.tensor`` detaches in place; inside the region's
  fake run the fake mode refused that ("Can't call metadata mutating ops on non-Fake
  Tensor inputs"). A plain tensor's own ops now run on the meta device as they are.
- XLNet makes its attention weights with ``torch.FloatTensor(...)``, which ignores the
  default device: built under ``torch.device("meta")`` (as ``autoplan suggest`` builds a
  model), they lie on the CPU beside meta inputs, and the first product failed ("found at
  least two devices, meta and cpu"). The trace puts the step's tensors on one device.
"""

import pytest
import torch
from conftest import ROOT
from zoo import verify_on_fake_world

import autoplan
from autoplan.model_file import import_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


def _plan_built_on_meta(name: str):
    models = import_model_file(MODEL_FILE)
    with torch.device("meta"):
        model, batch = getattr(models, name)(), models.example_inputs()
    devices = {p.device.type for p in model.parameters()}
    return autoplan.suggest(model, batch, mesh=MESH, axis_names=AXIS_NAMES), devices


@pytest.mark.slow  # plans and steps the model on a fake process group
@pytest.mark.parametrize("name", ["xlm", "xlnet"])
def test_plans_built_on_meta_and_a_step_runs_the_predicted_collectives(name):
    plan, devices = _plan_built_on_meta(name)
    if name == "xlm":
        assert plan.opaque_modules == ("transformer",)
    else:
        assert devices == {"meta", "cpu"}, devices  # what made the trace fail
    models = import_model_file(MODEL_FILE)
    result = verify_on_fake_world(build_seeded(models, name, 0), seeded_batch(models, 1), plan)
    assert result.passed, "\n" + result.summary()
