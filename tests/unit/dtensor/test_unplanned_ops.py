"""An op a planned step meets with no DTensor rule, which the plan did not list (the trace
never ran it), runs replicated with a warning instead of failing the step."""

import warnings

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.dtensor import overrides
from autoplan.dtensor.rules import replicate_everything

NO_RULE = torch.ops.aten.renorm.default  # DTensor has no sharding rule for it, nor for its decomposition's prims.where


@pytest.fixture
def mesh(fake_mesh_2x4):
    return fake_mesh_2x4


def test_an_op_without_a_rule_runs_replicated_with_a_warning(mesh):
    whole = torch.randn(8, 16)
    value = distribute_tensor(whole, mesh, [Shard(0), Shard(1)])
    overrides._unplanned_warned.clear()
    warned = pytest.warns(UserWarning, match="has no DTensor sharding rule and the plan did not list it")
    with overrides.installed(), overrides.planned_step(), warned:
        out = torch.renorm(value, 2, 0, 1.0)
    assert tuple(out.placements) == (Replicate(), Replicate())
    assert out.to_local().shape == whole.shape  # every rank holds it whole (a fake process group moves no data)
    with overrides.installed(), overrides.planned_step(), warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per op
        torch.renorm(value, 2, 0, 1.0)


def test_outside_a_planned_step_it_still_fails(mesh):
    """``autoplan calibrate`` runs ops under the overrides too, and skips those DTensor cannot run."""
    value = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    with overrides.installed(), pytest.raises(NotImplementedError, match="does not have a sharding strategy"):
        torch.renorm(value, 2, 0, 1.0)


def test_the_rule_is_gone_with_the_overrides(mesh):
    value = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    with overrides.installed(), overrides.planned_step(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.renorm(value, 2, 0, 1.0)
    propagator = torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator
    assert not [op for op, rule in propagator.op_strategy_funcs.items() if getattr(rule, "__wrapped__", None) is replicate_everything]
    with pytest.raises(NotImplementedError, match="does not have a sharding strategy"):
        torch.renorm(distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Replicate()]), 2, 0, 1.0)


def test_a_compiled_step_runs_it_replicated_too(mesh):
    """``torch.compile`` asks for the op's sharding while tracing (another entry point than
    the eager step's); the fallback holds there too (timm's EfficientViT: ``hardswish_backward``
    in a compiled backward failed with "does not have a sharding strategy registered")."""
    torch._dynamo.reset()
    value = distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
    compiled = torch.compile(lambda t: torch.renorm(t, 2, 0, 1.0), backend="aot_eager", fullgraph=True)
    with overrides.installed(), overrides.planned_step(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(value)
    assert tuple(out.placements) == (Replicate(), Replicate())
    torch._dynamo.reset()
