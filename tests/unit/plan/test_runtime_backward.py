"""A standard deviation's backward recomputes its input's mean (``x - x.mean(dims)``) over
the input as autograd saved it: split on the reduced dim, DTensor having gathered it inside
the forward, below autograd, that mean is partial, and the subtraction moves the mean (an
all_reduce) or the input (a gather), as DTensor's rule picks
(``plan/runtime_backward.recentred_mean_moves``). Gemma 3n's activation sparsity takes the
standard deviation of its MLP's gate split by hidden on dp; the prediction left out the
all_reduce of the mean in each layer's backward."""

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.choices.graph import build_choices
from autoplan.cost.comm import redistribute_collectives
from autoplan.dtensor import overrides
from autoplan.plan.runtime_backward import recentred_mean_moves
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten
BY_HIDDEN = ("S(2)", "S(0)")  # split by the reduced dim on dp, by batch on tp


class CommsOfOneOp(TorchDispatchMode):
    """The collectives DTensor runs to run each call of ``op`` (its moves of that op's operands)."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.ran: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is not self.op:
            return func(*args, **(kwargs or {}))
        with CommDebugMode() as comms:
            out = func(*args, **(kwargs or {}))
        self.ran += [_kind(op) for op, n in comms.get_comm_counts().items() for _ in range(n)]
        return out


def _kind(op) -> str:
    return str(op).split(".")[-1].replace("_into_tensor", "")


class GaussianCutoff(nn.Module):
    """Gemma 3n's activation sparsity: what lies below the mean plus a multiple of the
    standard deviation, over the hidden dim, is cut."""

    def forward(self, x):
        cutoff = x.mean(-1, keepdim=True) + 1.5 * x.std(-1, keepdim=True, unbiased=False)
        return torch.relu(x - cutoff).sum()


@pytest.mark.parametrize("width", [64, 4096])
def test_a_standard_deviation_over_a_split_dim_moves_what_dtensor_moves(fake_mesh_2x4, width):
    graph = build_choices(trace_model(GaussianCutoff(), (torch.randn(8, 16, width),)), (2, 4), ("dp", "tp")).graph
    (std,) = [d for d in graph.decisions() if d.fx_node.target is aten.std.correction]
    mesh = fake_mesh_2x4
    with overrides.installed():
        assert recentred_mean_moves(std, ("R", "S(0)"), mesh) is None
        moves = recentred_mean_moves(std, BY_HIDDEN, mesh)
    predicted = sorted(
        kind
        for _, before, read, nbytes, shape in moves
        for kind, *_ in redistribute_collectives(before, read, nbytes, (2, 4), backward=False, shape=shape)
    )

    # what DTensor runs: the forward gathers the input inside the op, the backward moves one operand
    with overrides.installed():
        local = torch.randn(2, 16, width // 2)
        x = DTensor.from_local(local, mesh, [Shard(2), Shard(0)], shape=(8, 16, width), stride=(16 * width, width, 1))
        x.requires_grad_()
        y = x.std(-1, keepdim=True, correction=0)
        # the gradient laid out as DTensor made the deviation (torch 2.14 splits it by rows on dp
        # at the larger width, where 2.13 made it whole there): its local shape is y's
        grad = DTensor.from_local(torch.ones(y.to_local().shape), mesh, list(y.placements), shape=(8, 16, 1), stride=(16, 1, 1))
        with CommDebugMode() as comms, CommsOfOneOp(aten.sub.Tensor) as recentring:
            torch.autograd.grad(y, x, grad)
    ran = sorted(_kind(op) for op, n in comms.get_comm_counts().items() for _ in range(n))
    # the subtraction moves one operand, as predicted; the rest of the backward moves only the
    # deviation's gradient, where DTensor made the deviation split by rows (torch 2.14 at the
    # larger width: the product with the recentred input gathers it)
    assert sorted(recentring.ran) == predicted and len(predicted) == 1
    rest = list(ran)
    rest.remove(predicted[0])
    y_made_whole_by_rows = all(not (p.is_shard() and p.dim == 1) for p in y.placements)
    assert rest == ([] if y_made_whole_by_rows else ["all_gather"])
