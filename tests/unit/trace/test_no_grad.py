"""Ops the forward runs without autograd (``trace/no_grad.py``) get no gradient in the plan:
HRM runs all but the last of its recurrent cycles under ``torch.no_grad()``. The ops inside
an ``autograd.Function``'s forward, which autograd always runs so, still get theirs."""

import torch
from torch import nn

from autoplan.choices.graph import build_choices
from autoplan.trace.tracer import trace_model


class Recurrent(nn.Module):
    """Cycles of one block, all but the last without autograd (HRM's one-step gradient)."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(16, 16)

    def forward(self, x):
        h = torch.zeros_like(x)
        with torch.no_grad():
            for _ in range(2):
                h = self.block(h + x)
        return self.block(h + x)


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class WithFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return Doubled.apply(self.proj(x))


def _trace(module):
    with torch.device("meta"):
        return trace_model(module, (torch.randn(4, 16),), loss_fn=lambda out, batch: out.sum())


def test_the_cycles_run_without_autograd_get_no_gradient():
    traced = _trace(Recurrent())
    products = [n.name for n in traced.graph_module.graph.nodes if n.target == torch.ops.aten.addmm.default]
    assert len(products) == 3
    assert set(products[:2]) <= traced.no_grad and products[2] not in traced.no_grad
    graph = build_choices(traced, (2, 4), ("dp", "tp")).graph
    assert [graph.decision(name).requires_grad for name in products] == [False, False, True]


def test_an_autograd_function_forward_still_gets_its_gradient():
    traced = _trace(WithFunction())
    assert not traced.no_grad
    graph = build_choices(traced, (2, 4), ("dp", "tp")).graph
    (doubled,) = [n.name for n in traced.graph_module.graph.nodes if n.target == torch.ops.aten.mul.Tensor]
    assert graph.decision(doubled).requires_grad


class RecurrentWithGrad(Recurrent):
    def forward(self, x):
        h = torch.zeros_like(x)
        for _ in range(2):
            h = self.block(h + x)
        return self.block(h + x)


def test_the_fingerprint_tells_the_two_apart():
    """The same graph with and without a region run without autograd plans otherwise: a
    cached plan of one must not answer for the other."""
    with_region, without = _trace(Recurrent()), _trace(RecurrentWithGrad())
    assert [n.target for n in with_region.graph_module.graph.nodes] == [n.target for n in without.graph_module.graph.nodes]
    assert with_region.fingerprint != without.fingerprint
