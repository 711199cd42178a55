"""``apply/recompute.py``: a checkpointed module reruns as often as autograd asks. A
backward split in two passes (the zero-bubble pipeline schedules: the input's gradient,
then the weights') reruns its forward in each, entering the rerun context twice."""

from contextlib import contextmanager

import torch
from torch import nn

from autoplan.apply.recompute import checkpoint_modules


def test_a_backward_in_two_passes_reruns_the_block_twice_under_a_fresh_context():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    entered = []

    @contextmanager
    def rerun_context():
        entered.append(1)
        yield

    checkpoint_modules({"block": block}, {"block": "full"}, rerun_context)
    x = torch.randn(3, 4, requires_grad=True)
    loss = block(x).square().sum()
    (dx,) = torch.autograd.grad(loss, [x], retain_graph=True)
    dw = torch.autograd.grad(loss, list(block.parameters()))
    assert len(entered) == 2  # one rerun per pass; a contextmanager object enters once only
    reference = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    reference.load_state_dict(block.state_dict())
    expected = torch.autograd.grad(reference(x).square().sum(), [x, *reference.parameters()])
    assert torch.allclose(dx, expected[0]) and all(torch.allclose(a, b) for a, b in zip(dw, expected[1:]))
