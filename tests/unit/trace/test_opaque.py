"""A module that takes the local shards of its own DTensor parameters (``self.w.to_local()``,
as torchtitan's grouped experts do) is an opaque region: it runs on whole parameters, the
only layout in which its own code computes the model's result (a shard of ``w`` fed to its
matmul failed with mismatched sizes, or silently computed on part of the weight)."""

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from zoo import verify_on_fake_world

from autoplan.pipeline.suggest import suggest_with_report
from autoplan.trace import opaque
from autoplan.trace.tracer import trace_model


class LocalShardProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        w = self.w.to_local() if isinstance(self.w, DTensor) else self.w
        return x @ w


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 16)
        self.experts = LocalShardProjection()

    def forward(self, x):
        return self.experts(torch.relu(self.up(x))).square().mean()


def test_a_module_taking_its_own_local_shards_runs_on_whole_parameters():
    torch.manual_seed(0)
    model, batch = Net(), (torch.randn(8, 16),)
    assert opaque.takes_local_shards(LocalShardProjection) and not opaque.takes_local_shards(nn.Linear)
    traced = trace_model(model, batch)
    assert traced.opaque_reasons == {"experts": opaque.LOCAL_SHARDS}
    plan, _ = suggest_with_report(model, batch, mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo",
                                  pinned={"experts.w": ("R", "S(0)")})  # stored split, gathered by the region
    assert plan.opaque_modules == ("experts",)
    assert any("takes local shards of its own DTensor parameters" in w for w in plan.warnings)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
