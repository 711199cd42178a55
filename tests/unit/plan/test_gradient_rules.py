"""Gradients of operands an op broadcast: autograd sums the output's gradient over the
broadcast dims, so the rule that hands a gradient on as it comes must not cover them
(``plan/gradient_rules.py``).

- DeepSeek-V4's hyper-connection splits its learned bias in parts and adds each to a
  slice of a projection split by batch: each part's gradient is partial there, and the
  prediction handed it on split by batch (the split's outputs are getitems, which the
  planning graph has no decision of, so the parts were taken for values without a
  gradient and the add for one of operands of its own shape).
- DeBERTa's layer norm multiplies its weight by ``x - mean(x)``, averaged-partial where
  the hidden dim is split: the sum that makes the weight's gradient does not take the
  average partial on, so DTensor reduces it and also gathers the batch split on another
  axis first (torch 2.13; 2.14, autoplan's strategy choice in force, reduces it and
  sums the batch split to a partial); the prediction left the batch split, all-reduced a part of the product only
  and then the weight's gradient once more. The prediction asks DTensor's sum now."""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from autoplan.choices.graph import build_choices
from autoplan.cost.comm import gradient_collectives
from autoplan.dtensor import overrides
from autoplan.placements import PARTIAL, REPLICATE, spec_from_placements
from autoplan.plan.gradient_rules import averaged_product_summed, passes_gradient, passes_gradient_to
from autoplan.plan.runtime_backward import averaged_product_sum
from autoplan.trace.tracer import trace_model
from autoplan.verify.observe import CollectiveCounter

aten = torch.ops.aten
BY_BATCH = "S(0)"


class SplitBias(nn.Module):
    """A learned bias in two parts, each added to its slice of a projection, scaled."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 8, bias=False)
        self.base = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        a, b = self.proj(x).split(4, dim=-1)
        bias_a, bias_b = self.base.split(4)
        return (torch.sigmoid(2 * a + bias_a) * torch.sigmoid(2 * b + bias_b)).sum()


class CenteredNorm(nn.Module):
    """A layer norm written out, with its weight (DeBERTa's)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64))

    def forward(self, x):
        centered = x - x.mean(-1, keepdim=True)
        normed = centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-12)
        return (self.weight * normed).sum()


def _graph(model, *inputs):
    return build_choices(trace_model(model, inputs), (2, 4), ("dp", "tp")).graph


def test_an_add_of_a_split_bias_part_sums_its_gradient():
    graph = _graph(SplitBias(), torch.randn(8, 12, 16))
    adds = [d.name for d in graph.decisions() if d.fx_node is not None and d.fx_node.target is aten.add.Tensor]
    assert len(adds) == 2
    for add in adds:
        assert not passes_gradient(graph, add)
        assert passes_gradient_to(graph, add, 0) and not passes_gradient_to(graph, add, 1)


def test_dtensor_hands_a_bias_part_added_to_a_batch_split_a_partial_gradient(fake_mesh_2x4):
    x = DTensor.from_local(torch.randn(2, 4), fake_mesh_2x4, (Replicate(), Shard(0)))
    base = DTensor.from_local(torch.zeros(4), fake_mesh_2x4, (Replicate(), Replicate())).requires_grad_()
    (part,) = base.split(4)
    (grad,) = torch.autograd.grad(torch.sigmoid(x + part).sum(), part)
    assert grad.placements == (Replicate(), Partial("sum"))


def test_the_weight_gradient_of_an_averaged_product_is_summed_as_dtensor_sums_it(fake_mesh_2x4):
    graph = _graph(CenteredNorm(), torch.randn(8, 16, 64))
    (product,) = [
        d.fx_node for d in graph.decisions()
        if d.fx_node is not None and d.fx_node.target is aten.mul.Tensor and d.fx_node.args[0].op == "placeholder"
    ]
    averaged = (PARTIAL, BY_BATCH)  # x - mean(x) averaged-partial on dp, the batch split on tp
    asked = averaged_product_sum(product, (64,), averaged, (2, 4))
    assert asked is not None
    summed_in, summed_out = asked
    predicted = sorted((kind, axis) for kind, axis, _ in gradient_collectives(averaged, summed_in, 8 * 16 * 64 * 4, (2, 4)))
    # what DTensor runs for the sum over the weight's broadcast dims of such a product, with
    # autoplan's changes in force as in a planned step (torch 2.14's own choice would split
    # the batch on dp too, which autoplan's strategy choice keeps it from)
    made = DTensor.from_local(torch.randn(2, 16, 64), fake_mesh_2x4, (Partial("avg"), Shard(0)))
    with overrides.installed(), CollectiveCounter(nn.Linear(1, 1), fake_mesh_2x4) as counter:
        out = made.sum([0, 1], keepdim=True)
    axes = {"dp": 0, "tp": 1}
    ran = sorted((c.kind, axes[c.axis]) for c, n in counter.collectives.items() for _ in range(n))
    assert predicted == ran and ran  # the average partial is never summed as it is
    assert summed_out == tuple(spec_from_placements(out.placements))
    if summed_in == (REPLICATE, REPLICATE):  # torch 2.13's sum reduces it and gathers the batch whole first
        assert averaged_product_summed(product, (64,), averaged) == summed_in  # the planner's own rule agrees
        assert predicted == [("all_gather", 1), ("all_reduce", 0)]
