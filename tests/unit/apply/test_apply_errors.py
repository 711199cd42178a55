"""The apply engine refuses plans that do not fit the model or the mesh, with the fix."""

from dataclasses import replace

import pytest
import torch
from torch import nn

import autoplan
from autoplan.choices.graph import planning_mesh
from autoplan.errors import PlanError


def small_plan():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
        x = torch.randn(8, 16)
    return autoplan.suggest(model, (x,), mesh=(4,), axis_names=("dp",))


def test_mesh_shape_mismatch_is_refused():
    plan = small_plan()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    with pytest.raises(PlanError, match="plan is for a 4 mesh.*2x2"):
        autoplan.apply_plan(model, plan, planning_mesh((2, 2), ("a", "b")))


def test_model_that_does_not_match_the_plan_is_refused():
    plan = small_plan()
    other = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16), nn.Linear(16, 16))
    with pytest.raises(PlanError, match="does not match the model.*3.weight"):
        autoplan.apply_plan(other, plan, planning_mesh((4,), ("dp",)))


def test_every_parameter_is_in_the_plan():
    plan = small_plan()
    assert set(plan.parameters) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(plan.inputs) == {"[0][0]"}


def test_model_of_other_widths_or_module_classes_is_refused():
    plan = small_plan()
    wider = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))  # same names, other shapes
    with pytest.raises(PlanError, match=r"0.weight has shape \[32, 16\], the plan was made for \[64, 16\]"):
        autoplan.apply_plan(wider, plan, planning_mesh((4,), ("dp",)))
    plan = replace(plan, module_types={**plan.module_types, "0": "Conv1d"})
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    with pytest.raises(PlanError, match="module 0 is a Linear, the plan was made for a Conv1d"):
        autoplan.apply_plan(model, plan, planning_mesh((4,), ("dp",)))
