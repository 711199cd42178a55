"""A forward move of a value autograd saves is not run again in the backward
(``autoplan/dtensor/saved_inputs.py``)."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.apply.engine import plan_execution


def _all_gathers(comm: CommDebugMode) -> int:
    return sum(n for op, n in comm.get_comm_counts().items() if "all_gather" in str(op))


def _gathers_of_a_step(weight_shape, weight_split: int, loss_of) -> tuple[int, int]:
    """(forward, backward) all_gathers of ``loss_of(weight, x)`` with the weight stored split
    on ``weight_split`` and ``x`` (16 x 8) split by rows, on a fake process group of 4."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(weight_shape), mesh, [Shard(weight_split)]))
        x = distribute_tensor(torch.randn(16, 8), mesh, [Shard(0)]).requires_grad_()
        with plan_execution(mesh):
            with CommDebugMode() as forward:
                loss = loss_of(weight, x)
            with CommDebugMode() as backward:
                loss.backward()
        assert x.grad is not None and weight.grad is not None
        return _all_gathers(forward), _all_gathers(backward)
    finally:
        dist.destroy_process_group()


def test_a_saved_parameter_gathered_for_an_op_is_not_gathered_again_in_its_backward():
    """``weight * x`` (an RMSNorm's scale) with the weight stored split and ``x`` split by
    rows gathers the weight for the product; the product's backward (``grad * weight``) needs it whole again. Autograd gives
    the backward a new alias of the saved parameter, not the tensor the forward moved, and
    the kept gather must still be found. The product's gradient comes back split by rows."""
    assert _gathers_of_a_step((8,), 0, lambda weight, x: (weight * x).pow(2).sum()) == (1, 0)


def test_a_weight_gathered_inside_a_matrix_product_is_not_gathered_again_for_its_transpose():
    """``x @ w.T`` with ``x`` split by rows and ``w.T`` split by rows too gathers the weight
    inside the product (Longformer's output head); the product's backward multiplies the
    gradient by the saved operand's transpose, a new view of it split the other way, which
    asks for the same gather: the kept one is found through the permuted view."""
    assert _gathers_of_a_step((8, 8), 1, lambda weight, x: (x @ weight.t()).pow(2).sum()) == (1, 0)
