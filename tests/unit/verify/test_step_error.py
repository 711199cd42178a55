"""A failed planned step says whose failure it is (``verify/step_check.py``: ``step_error``):
one raised where the model's own code ran keeps the hint about DTensors in that code; one
raised inside torch and autoplan alone (a compiled backward moving a gradient, dynamo)
says it is autoplan's, not the user's."""

import functools

import torch
from torch import nn
from torch.distributed.tensor import Partial, Replicate, distribute_tensor

from autoplan.verify.step_check import step_error


class ReadsAValue(nn.Module):
    def forward(self, x):
        if x.sum().item() > 0:  # the model's own line
            raise RuntimeError("aten._local_scalar_dense.default: got a DTensor")
        return x


def _raised(call):
    """The error ``call()`` raises, caught here as the step catches it (this frame is the catcher's)."""
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the error under test
        return err
    raise AssertionError("expected an error")


def test_an_error_in_the_models_code_keeps_the_dtensor_hint():
    model = ReadsAValue()
    err = _raised(lambda: model(torch.ones(2)))
    message = str(step_error(err, model))
    assert "module <root> (ReadsAValue)" in message
    assert "read host values with .full_tensor() first" in message
    assert "autoplan's fault" not in message


def test_an_error_inside_torch_alone_is_autoplans_own(fake_mesh_2x4):
    replicated = distribute_tensor(torch.ones(4), fake_mesh_2x4, [Replicate(), Replicate()])
    # What a compiled backward does with a replicated gradient where the graph's output was averaged.
    err = _raised(functools.partial(replicated.redistribute, fake_mesh_2x4, [Partial("avg"), Replicate()]))
    message = str(step_error(err, nn.Linear(1, 1)))
    # torch's own line (its reason after the comma differs: 2.13 "... is for internal use only",
    # 2.14 "only Shard to Partial(sum) redistribution is supported")
    assert "Can not redistribute from R to P(avg)" in message and str(err).splitlines()[0] in message
    assert "inside torch and autoplan alone" in message
    assert "this is autoplan's fault, not yours" in message
    assert ".full_tensor() first" not in message


def test_dynamos_internal_errors_are_autoplans_own():
    from torch._dynamo.exc import InternalTorchDynamoError

    err = InternalTorchDynamoError("TypeError: unhashable type: non-nested SymInt")
    assert "autoplan's fault" in str(step_error(err, nn.Linear(1, 1)))


def test_a_message_that_introduces_its_error_keeps_it():
    err = RuntimeError("backend='aot_eager' raised:\nRuntimeError: Can not redistribute from R to P(avg)\n\nSet TORCH_LOGS")
    message = str(step_error(err, nn.Linear(1, 1)))
    assert "raised: RuntimeError: Can not redistribute from R to P(avg)" in message
    assert "TORCH_LOGS" not in message
