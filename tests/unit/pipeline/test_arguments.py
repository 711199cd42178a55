"""autoplan.suggest checks its arguments at the boundary with the command line's rules,
raising autoplan's errors (ValueError / TypeError subclasses), before any tracing."""

import pytest
import torch
from torch import nn

import autoplan
from autoplan.errors import ArgumentTypeError, MeshError, OptionError


def tiny():
    with torch.device("meta"):
        return nn.Linear(8, 8), (torch.randn(4, 8),)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(mesh=(2.5, 2)), ArgumentTypeError, "expected whole mesh sizes, got 2.5"),
        (dict(mesh="2x4"), ArgumentTypeError, "expected a mesh as a tuple of sizes, got str '2x4'"),
        (dict(mesh=(2, 0)), MeshError, "mesh axis sizes must be at least 1, got \\(2, 0\\)"),
        (dict(mesh=()), MeshError, "at least one axis"),
        (dict(mesh=(True, 2)), ArgumentTypeError, "expected whole mesh sizes"),
        (dict(mesh=(2, 2), memory_gb=0), OptionError, "expected memory_gb > 0, got 0"),
        (dict(mesh=(2, 2), memory_gb=float("inf")), OptionError, "expected memory_gb > 0, got inf"),
        (dict(mesh=(2, 2), memory_gb="40"), ArgumentTypeError, "expected memory_gb as a number"),
        (dict(mesh=(2, 2), time_limit_s=-1), OptionError, "expected time_limit_s > 0"),
        (dict(mesh=(2, 2), axis_names=("a", "a")), MeshError, "axis names must be distinct"),
        (dict(mesh=(2, 2), axis_names=("dp",)), MeshError, "got 1 axis names \\('dp',\\) for the 2-axis mesh 2x2"),
        (dict(mesh=(2, 2), axis_names="dp,tp"), ArgumentTypeError, "expected axis names as a tuple of strings"),
        (dict(mesh=(2, 2), axis_names=("dp", "t p")), MeshError, "non-empty identifiers"),
        (dict(mesh=(2, 2), profile=3), ArgumentTypeError, "expected profile as a name, a path or a ClusterProfile"),
    ],
)
def test_bad_arguments_raise_autoplans_errors(kwargs, error, message):
    model, inputs = tiny()
    with pytest.raises(error, match=message) as caught:
        autoplan.suggest(model, inputs, cache=False, **kwargs)
    assert isinstance(caught.value, (ValueError, TypeError)) and "fix:" in str(caught.value)


def test_a_path_as_the_model_is_a_type_error():
    with pytest.raises(TypeError, match="expected the model as an nn.Module, got str 'mlp.py'"):
        autoplan.suggest("mlp.py", (), mesh=(2, 2), cache=False)
    model, _ = tiny()
    with pytest.raises(TypeError, match="expected example_inputs as a tuple"):
        autoplan.suggest(model, 3, mesh=(2, 2), cache=False)


def test_a_huge_mesh_is_planned_with_a_warning():
    model, inputs = tiny()
    with pytest.warns(UserWarning, match="mesh 1024x1024 has 1048576 devices"):
        plan = autoplan.suggest(model, inputs, mesh=(1024, 1024), cache=False, time_limit_s=5)
    assert plan.mesh_shape == (1024, 1024)
