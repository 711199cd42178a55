"""timm's ConvNeXt and open_clip's CLIP as their users build them, planned, stepped and verified.

timm and open_clip import only beside torchvision, which in this project's environments
imports with torch 2.14 only: these tests skip elsewhere, and are run in that environment.

- ConvNeXt (``tests/models/timm_convnext.py``): ``LayerNorm2d`` leaves the activations
  channels-last, which the device's convolutions keep, and the head pools them with a mean
  and an in-place restride (``as_strided_``) DTensor runs in no layout. torch's meta
  convolution answered a contiguous result, so the trace never saw the restride and the
  step failed in ``head.global_pool.pool`` ("aten.as_strided_.default does not have a
  sharding strategy registered"), even with every weight replicated. The trace now lays
  a convolution's result out as the device kernels do (``dtensor/fake_kernels.py``), and
  the pool runs whole as an opaque region, as HF Swin's pooler does.
- CLIP (``tests/models/open_clip_vit.py``): ``nn.MultiheadAttention`` reads its ``out_proj``'s
  parameters itself and unflattens its packed q/k/v projection by 3, which DTensor refused
  on tp's 4 ranks ("Cannot unflatten unevenly sharded tensor"). With weights split on both
  axes, its step runs the collectives its plan was priced by (a dry run of that step).
"""

import pytest
from conftest import ROOT
from zoo import assert_step_runs_the_prediction, both_axes_plan

import autoplan
from autoplan.model_file import load_model_file

MODELS = ROOT / "tests" / "models"
CONVNEXT = MODELS / "timm_convnext.py"
CLIP = MODELS / "open_clip_vit.py"

pytestmark = pytest.mark.slow  # plans whole library models


def _default_plan(path):
    loaded = load_model_file(str(path))
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"),
                            loss_fn=loaded.loss_fn, cache=False)


def _sharded_on(plan, axis: int) -> list[str]:
    return [fqn for fqn, spec in plan.parameters.items() if spec[axis] != "R"]


@pytest.fixture(scope="module")
def convnext_plans():
    pytest.importorskip("timm")
    return _default_plan(CONVNEXT), both_axes_plan(str(CONVNEXT))


def test_the_convnext_pool_runs_whole(convnext_plans):
    for plan in convnext_plans:
        assert plan.opaque_modules == ("head.global_pool.pool",)
        assert any("head.global_pool.pool" in warning for warning in plan.warnings)
    forced = convnext_plans[1]
    assert _sharded_on(forced, 0) and _sharded_on(forced, 1), forced.parameters


def test_convnext_steps_run_the_predicted_collectives(convnext_plans):
    for plan in convnext_plans:
        assert_step_runs_the_prediction(CONVNEXT, "build_model", plan)


@pytest.fixture(scope="module")
def clip_default_plan():
    pytest.importorskip("open_clip")
    return _default_plan(CLIP)


def test_a_clip_step_runs_the_predicted_collectives(clip_default_plan):
    assert_step_runs_the_prediction(CLIP, "build_model", clip_default_plan)


def test_a_sharded_clip_step_runs_the_predicted_collectives():
    pytest.importorskip("open_clip")
    plan = both_axes_plan(str(CLIP))
    assert_step_runs_the_prediction(CLIP, "build_model", plan)
