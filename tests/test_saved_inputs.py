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


def test_a_saved_parameter_gathered_for_an_op_is_not_gathered_again_in_its_backward():
    """``weight * x`` (an RMSNorm's scale) with the weight stored split and ``x`` split by
    rows gathers the weight for the product; the product's backward (``grad * weight``) needs it whole again. Autograd gives
    the backward a new alias of the saved parameter, not the tensor the forward moved, and
    the kept gather must still be found."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        weight = torch.nn.Parameter(distribute_tensor(torch.randn(8), mesh, [Shard(0)]))
        x = distribute_tensor(torch.randn(16, 8), mesh, [Shard(0)]).requires_grad_()
        with plan_execution(mesh):
            with CommDebugMode() as forward:
                loss = (weight * x).pow(2).sum()  # the product's gradient comes back split by rows
            with CommDebugMode() as backward:
                loss.backward()
        assert _all_gathers(forward) == 1
        assert _all_gathers(backward) == 0
        assert x.grad is not None and weight.grad is not None
    finally:
        dist.destroy_process_group()
