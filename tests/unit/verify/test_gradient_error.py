"""How far a plan's gradient may be from one device's (``verify/numerics.py``: ``gradient_error``).
A gradient that is zero in exact arithmetic (a bias whose gradient a following GroupNorm
cancels, as in a diffusers UNet) holds rounding alone on both sides: it is judged by one
device's rounding, twice over, not by its own size."""

import torch

from autoplan.verify.numerics import ROUNDING_SHARE, gradient_error

NOISE = 3e-9


def test_a_cancelled_gradient_is_judged_by_both_roundings():
    exact = torch.full((4,), 1e-17, dtype=torch.float64)  # zero but for float64's own rounding
    reference = torch.tensor([NOISE, -NOISE, 0.0, NOISE])  # one device: rounding alone
    plan = torch.tensor([-0.26 * NOISE, NOISE, 0.0, NOISE])  # the plan: rounded otherwise, 1.26 x apart
    assert 1.25 * ROUNDING_SHARE / 2 < gradient_error(plan, reference, exact, floor=0.0) <= ROUNDING_SHARE
    off = torch.tensor([-2.5 * NOISE, NOISE, 0.0, NOISE])  # further than both roundings: a wrong gradient
    assert gradient_error(off, reference, exact, floor=0.0) > ROUNDING_SHARE


def test_a_gradient_with_a_value_keeps_one_rounding():
    exact = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    reference = (exact + 1e-4).float()  # one device off by 1e-4: its rounding sets the scale, 1e-4 / 1e-5
    assert gradient_error(reference + 0.9e-4, reference, exact, floor=0.0) <= ROUNDING_SHARE
    assert gradient_error(reference + 1.3e-4, reference, exact, floor=0.0) > ROUNDING_SHARE  # not twice it


def test_without_float64_the_size_and_floor_judge():
    reference = torch.tensor([1.0, 2.0])
    assert abs(gradient_error(reference + 1e-3, reference, None, floor=0.0) - 1e-3 / 2) < 1e-6
    assert gradient_error(reference + 1e-3, reference, None, floor=10.0) < 1e-3 / 2
