"""Autocast regions on the meta device (``autoplan/trace/meta_autocast.py``).

A router that scores tokens under ``torch.autocast(device_type=x.device.type, enabled=False)``,
as torchtitan's MoE router does (``tests/models/autocast_router.py``), plans on meta tensors
and runs a fake-process-group step with exactly its predicted collectives. torch itself is
left as it was: after the trace, after a trace that failed, and meanwhile on other threads,
``torch.autocast("meta")`` is refused as torch refuses it, and other devices' autocast works.
"""

import re
import threading

import pytest
import torch
import torch.amp.autocast_mode as autocast_mode
from conftest import ROOT
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from zoo import forced_plan, verify_on_fake_world

import autoplan
from autoplan.errors import TraceError
from autoplan.model_file import import_model_file, load_model_file
from autoplan.trace.meta_autocast import meta_autocast
from autoplan.verify.numerics import build_seeded, seeded_batch

ROUTER = ROOT / "tests" / "models" / "autocast_router.py"
# torch refuses "meta" when it looks up the default dtype, or, given one, by name.
UNSUPPORTED = r"unsupported scalarType|unsupported autocast device_type 'meta'"
TORCH_METHODS = {name: getattr(autocast_mode.autocast, name) for name in ("__init__", "__enter__", "__exit__")}


def _torch_is_as_it_was():
    assert {name: getattr(autocast_mode.autocast, name) for name in TORCH_METHODS} == TORCH_METHODS
    with pytest.raises(RuntimeError, match=UNSUPPORTED):
        torch.autocast(device_type="meta", enabled=False)
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'meta'"):
        torch.autocast(device_type="meta", dtype=torch.bfloat16)


def test_torch_alone_cannot_trace_the_router_on_meta():
    loaded = load_model_file(str(ROUTER))
    with pytest.raises(RuntimeError, match=UNSUPPORTED):
        make_fx(loaded.model, tracing_mode="fake")(*loaded.example_inputs)


def test_the_router_plans_and_runs_its_predicted_collectives_on_a_fake_process_group():
    plan = forced_plan(str(ROUTER))
    _torch_is_as_it_was()
    assert plan.predicted.collectives, "the forced plan communicates nothing"
    assert not [w for w in plan.warnings if "autocast" in w], plan.warnings  # autocast off: traced exactly
    module = import_model_file(ROUTER)
    model, batch = build_seeded(module, "build_model", 0), seeded_batch(module, 1)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()


def test_a_region_that_asks_for_autocast_is_named_in_the_plan():
    loaded = load_model_file(f"{ROUTER}:build_autocast_on")
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False)
    said = [w for w in plan.warnings if "autocast" in w]
    assert len(said) == 1 and said[0].startswith("1 autocast region(s) on the meta device"), plan.warnings


class _FailsInsideAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast(device_type=x.device.type, enabled=False):
            raise ValueError("broken router")


def test_torch_is_restored_after_a_trace_that_fails_inside_the_region():
    with torch.device("meta"):
        model, batch = _FailsInsideAutocast(), (torch.randn(2, 4),)
    with pytest.raises(TraceError, match="broken router"):
        autoplan.suggest(model, batch, mesh=(2, 4), cache=False)
    _torch_is_as_it_was()


def test_only_the_tracing_thread_sees_the_change_and_other_devices_keep_theirs():
    refused = []

    def other_thread():
        try:
            torch.autocast(device_type="meta")
        except RuntimeError as err:
            refused.append(str(err))

    with meta_autocast() as regions:
        with torch.autocast(device_type="meta", enabled=False):
            pass
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):  # torch's own, unchanged
            assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == torch.bfloat16
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert regions == [False]
    assert len(refused) == 1 and re.search(UNSUPPORTED, refused[0]), refused
    _torch_is_as_it_was()
