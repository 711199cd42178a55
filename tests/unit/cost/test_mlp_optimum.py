"""Must-show 1: an MLP on a 1-D mesh of 4 whose optimum is worked out by hand.

The profile is made so that the objective is pure arithmetic: matmuls run at
``PEAK`` flop/s, memory traffic, kernel launches and eager dispatch are free (the
dispatch costs are tested in ``tests/unit/cost/test_dispatch_costs.py``), and every collective
costs ``ALPHA + factor * bytes / BETA``. The model is ``Linear(d, 4d) -> ReLU ->
Linear(4d, d)`` (no biases) with a mean-square loss ``mean(out**2)``: a loss that is
not linear in ``out``, so a row-parallel output (partial sums) must be all-reduced
before it, the one activation all-reduce of Megatron's MLP. (With a plain ``sum``
loss the partial output never needs reducing.)

FLOPs of one step, float32, batch B: forward 8Bd^2 per layer; backward one matmul
per input that needs a gradient (layer 1: the weight; layer 2: the weight and the
hidden activation), so 8Bd^2 * (2 + 3) = 40Bd^2 in all. Every candidate below splits
the work 4 ways, so compute = 40Bd^2 / (4 * PEAK).

Column-then-row (W1 = S(0), W2 = S(1), input replicated): the only collective is the
forward all-reduce of out [B, d] before the loss; its backward is free.
    comm = ALPHA + 2 * 3/4 * 4Bd / BETA
Data parallel (batch S(0), weights replicated): each weight's gradient is all-reduced,
and so is the loss, a scalar partial over the batch split.
    comm = 2 * ALPHA + 2 * 3/4 * 4 * (4d^2 + 4d^2) / BETA + ALPHA + 2 * 3/4 * 4 / BETA
"""

import dataclasses

import pytest
import torch
from torch import nn

import autoplan
from autoplan.cost.profile import profile_from_dict

PEAK, ALPHA, BETA = 1e12, 1e-5, 1e10
FREE = 1e30  # memory bandwidth: makes memory traffic free (beyond the schema's physical bound: set after loading)
BOUNDED = 1e15  # the schema's largest bandwidth
TINY = 1e-30  # efficiency half-point: efficiency is 1 at any size


FREE_DISPATCH = {"forward_op_s": 0.0, "backward_op_s": 0.0, "optimizer_param_s": 0.0,
                 "optimizer_bytes_per_s": FREE, "overlaps_device": False}


def exact_profile(dispatch=None):
    """A loaded profile whose memory traffic (and, with FREE_DISPATCH, optimizer traffic)
    is free: an ideal machine, so those figures are set past the schema's bounds after loading."""
    dispatch = dispatch or FREE_DISPATCH
    link = {k: {"latency_s": ALPHA, "bus_bandwidth_bytes_per_s": BETA} for k in ("all_reduce", "all_gather",
        "reduce_scatter", "all_to_all")}
    profile = profile_from_dict({
        "schema_version": 2,
        "name": "hand-exact",
        "device": {"name": "ideal", "memory_bytes": 10**12, "memory_bandwidth_bytes_per_s": BOUNDED, "devices_per_node": 8,
                   "peak_flops": {"float32": PEAK}},
        "efficiency": {"matmul": {"max": 1.0, "half_at_flops": TINY}, "memory": {"max": 1.0, "half_at_bytes": TINY},
            "kernel_overhead_s": 0.0},
        "links": {"intra_node": link, "inter_node": link},
        "dispatch": {**dispatch, "optimizer_bytes_per_s": min(dispatch["optimizer_bytes_per_s"], BOUNDED)},
    })
    ideal = dataclasses.replace(profile.dispatch, optimizer_bytes_per_s=dispatch["optimizer_bytes_per_s"])
    return dataclasses.replace(profile, memory_bandwidth_bytes_per_s=FREE, dispatch=ideal)


class MeanSquareMLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.ReLU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x):
        return self.net(x).pow(2).mean()


def plan_for(d: int, batch: int):
    with torch.device("meta"):
        model = MeanSquareMLP(d)
        x = torch.randn(batch, d)
    return autoplan.suggest(model, (x,), mesh=(4,), axis_names=("tp",), profile=exact_profile())


def compute_s(d, b):
    return 40 * b * d * d / (4 * PEAK)


@pytest.mark.parametrize("d,batch", [(1024, 8), (2048, 16)])
def test_large_hidden_small_batch_is_column_then_row(d, batch):
    plan = plan_for(d, batch)
    assert plan.parameters["net.0.weight"] == ("S(0)",)
    assert plan.parameters["net.2.weight"] == ("S(1)",)
    assert plan.inputs["[0][0]"].placements == ("R",)
    expected = compute_s(d, batch) + ALPHA + 1.5 * 4 * batch * d / BETA
    assert plan.solver.objective == pytest.approx(expected, rel=1e-5)
    assert plan.predicted.step_time_s == pytest.approx(expected, rel=1e-5)
    assert plan.solver.status == "optimal"


@pytest.mark.parametrize("d,batch", [(64, 8192), (32, 4096)])
def test_small_hidden_large_batch_is_data_parallel(d, batch):
    plan = plan_for(d, batch)
    assert plan.parameters["net.0.weight"] == ("R",)
    assert plan.parameters["net.2.weight"] == ("R",)
    assert plan.inputs["[0][0]"].placements == ("S(0)",)
    # The step also all-reduces the loss, a float32 scalar partial over the batch split:
    # the plan's price is the step's own collectives (issue 45), that one included.
    loss = ALPHA + 1.5 * 4 / BETA
    expected = compute_s(d, batch) + 2 * ALPHA + 1.5 * 4 * 8 * d * d / BETA + loss
    assert plan.solver.objective == pytest.approx(expected, rel=1e-5)
    assert plan.predicted.comm_s == pytest.approx(2 * ALPHA + 1.5 * 4 * 8 * d * d / BETA + loss, rel=1e-5)
