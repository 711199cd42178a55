"""Backwards DTensor runs on a gradient split by batch as it comes, where the forward made
its output whole (``plan/split_gradients.py``): a padding's and a ``sum``'s with ``keepdim``
(their backwards slice or expand the gradient; a reduction's rule and the rule of
backwards that read the gradient alone cover them), and a convolution's (DTensor's backward
rule splits the batch: the filter's gradient comes back partial). Bailing-Hybrid's linear
attention runs all three on a gradient split by batch on tp; the prediction had each
gathered first, and left out the all_reduce of its convolution filter's gradient."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

from autoplan.choices.graph import build_choices
from autoplan.dtensor import overrides
from autoplan.placements import PARTIAL, REPLICATE
from autoplan.plan.split_gradients import (
    matmul_input_gradient,
    matmul_split_axes,
    split_through,
)
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten
WHOLE, BY_BATCH = (REPLICATE, REPLICATE), (REPLICATE, "S(0)")


class ShortConvolution(nn.Module):
    """A depthwise causal convolution whose filter is read outside its module, a padding
    of the sequence to whole chunks and an l2 norm (Bailing-Hybrid's linear attention)."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(32, 32, 4, groups=32, bias=False)

    def forward(self, x):
        h = F.conv1d(x, self.conv1d.weight, padding=3, groups=32)[..., : x.shape[-1]]
        h = F.pad(h, (0, 4))
        return (h * torch.rsqrt((h * h).sum(1, keepdim=True) + 1e-6)).sum()


def _graph_and_ops():
    graph = build_choices(trace_model(ShortConvolution(), (torch.randn(8, 32, 12),)), (2, 4), ("dp", "tp")).graph
    ops = {decision.fx_node.target: decision.name for decision in graph.decisions()}
    return graph, ops


def test_a_padding_and_a_sum_keep_their_gradient_split_by_batch():
    graph, ops = _graph_and_ops()
    pad, summed = ops[aten.constant_pad_nd.default], ops[aten.sum.dim_IntList]
    assert split_through(graph, pad, set(), BY_BATCH, WHOLE, (2, 4), {}) == (False, True)
    assert split_through(graph, pad, set(), (REPLICATE, "S(2)"), WHOLE, (2, 4), {}) == (False, False)  # the padded dim
    assert split_through(graph, summed, set(), BY_BATCH, WHOLE, (2, 4), {}) == (False, True)


def test_a_convolution_run_whole_hands_its_filter_a_partial_gradient(fake_mesh_2x4):
    graph, ops = _graph_and_ops()
    conv = ops[aten.convolution.default]
    saved_whole = {0: (WHOLE, WHOLE), 1: (WHOLE, WHOLE)}
    assert matmul_split_axes(graph, conv, set(), BY_BATCH, WHOLE, saved_whole) == (False, True)
    assert matmul_input_gradient(graph, conv, 0, BY_BATCH, WHOLE, set(), saved_whole, WHOLE) == BY_BATCH
    assert matmul_input_gradient(graph, conv, 1, BY_BATCH, WHOLE, set(), saved_whole, WHOLE) == (REPLICATE, PARTIAL)

    # what DTensor runs: the batch-split gradient as it comes, no gather
    mesh, whole = fake_mesh_2x4, [Replicate(), Replicate()]
    x = DTensor.from_local(torch.randn(8, 32, 12, requires_grad=True), mesh, whole)
    weight = DTensor.from_local(torch.randn(32, 1, 4, requires_grad=True), mesh, whole)
    with overrides.installed():
        grad = DTensor.from_local(torch.ones(8, 32, 15)[:2], mesh, [Replicate(), Shard(0)])
        with CommDebugMode() as comms:
            grad_x, grad_weight, _ = aten.convolution_backward.default(
                grad, x, weight, None, [1], [3], [1], False, [0], 32, [True, True, False]
            )
    assert comms.get_total_counts() == 0
    assert tuple(grad_x.placements) == (Replicate(), Shard(0))
    assert tuple(grad_weight.placements) == (Replicate(), Partial())
