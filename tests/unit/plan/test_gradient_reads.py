"""A product of two trained values reads its output's gradient once per input's gradient
(``plan/gradient_rules.gradient_reads``): ``a * b``'s backward runs ``grad * b`` and
``grad * a``, and DTensor moves the gradient for each on its own. litgpt's RMSNorm
squares with ``x * x``; split by width on dp, the mean of squares hands back a partial
gradient that each of the two products reduce-scatters."""

import torch
from torch import nn
from zoo import verify_on_fake_world

from autoplan.pipeline.suggest import suggest_with_report


class SquaresNorm(nn.Module):
    """RMSNorm with a unit offset, as litgpt writes it (Gemma's)."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        normed = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6)
        return normed * (1 + self.weight)


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.norm = SquaresNorm(64)
        self.down = nn.Linear(64, 8)

    def forward(self, x):
        return self.down(self.norm(self.up(x))).sum()


def test_a_square_reduces_its_gradient_once_per_factor():
    torch.manual_seed(0)
    model, batch = Normed(), (torch.randn(8, 16),)
    # column-parallel up and row-parallel down on dp: the norm runs split by width there
    pinned = {"up.weight": ("S(0)", "R"), "up.bias": ("S(0)", "R"), "norm.weight": ("S(0)", "R"),
              "down.weight": ("S(1)", "R"), "[0][0]": ("R", "S(0)")}
    plan, _ = suggest_with_report(model, batch, mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo", pinned=pinned)
    assert plan.modules["norm"].inputs["[0][0]"][0] == "S(1)"
    assert plan.predicted.module_collectives["norm"]["dp"]["reduce_scatter"]["count"] == 2
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
