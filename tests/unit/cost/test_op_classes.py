"""Op classes: which traced ATen ops share one set of eager-DTensor fixed costs, and the
calibration's representatives cover every class."""

import pytest
import torch

from autoplan.calibrate.dispatch_classes import _CASES
from autoplan.cost.estimate import MATMUL_OPS, VIEW_OPS
from autoplan.cost.op_classes import GENERIC, OP_CLASSES, op_class

aten = torch.ops.aten


@pytest.mark.parametrize(
    "op,expected",
    [
        (aten.view.default, "view"), (aten._unsafe_view.default, "view"), (aten.t.default, "view"),
        (aten.transpose.int, "view"), (aten.expand.default, "view"), (aten.slice.Tensor, "view"),
        (aten.add.Tensor, "elementwise"), (aten.mul.Scalar, "elementwise"), (aten.gelu.default, "elementwise"),
        (aten.rsqrt.default, "elementwise"), (aten.clone.default, "elementwise"), (aten.div_.Tensor, "elementwise"),
        (aten.mm.default, "matmul"), (aten.addmm.default, "matmul"), (aten.bmm.default, "matmul"),
        (aten.mean.dim, "elementwise"), (aten.sum.dim_IntList, "elementwise"), (aten.sum.default, "elementwise"),
        (aten._softmax.default, "softmax"), (aten._log_softmax.default, "softmax"), (aten._safe_softmax.default, "softmax"),
        (aten.native_layer_norm.default, "norm"), (aten.native_batch_norm.default, "norm"),
        (aten.embedding.default, "embedding"), (aten.nll_loss_forward.default, "loss"),
        (aten.convolution.default, "convolution"), (aten.cat.default, "indexing"), (aten.topk.default, "indexing"),
        (aten.index.Tensor, "indexing"),
    ],
)
def test_zoo_ops_map_to_their_class(op, expected):
    assert op_class(op) == expected


def test_ops_of_no_class_are_generic():
    assert op_class(aten.linalg_qr.default) == GENERIC
    assert op_class("autoplan.opaque_region") == GENERIC  # anything without an overload packet
    assert GENERIC not in OP_CLASSES


def test_cost_stage_views_and_matmuls_agree_with_the_classes():
    matmuls = MATMUL_OPS - {aten.convolution.default}
    assert {op_class(op) for op in VIEW_OPS} == {"view"}
    assert {op_class(op) for op in matmuls} == {"matmul"}


def test_calibration_times_every_class_and_only_classed_ops():
    assert {op_class(case.op) for case in _CASES} == set(OP_CLASSES)


def test_an_op_dtensor_cannot_run_here_is_skipped(monkeypatch):
    """On CUDA batch norm runs as cudnn_batch_norm, which has no DTensor rule; an op like it
    is left out of its class (the class's other ops price it) instead of failing the run."""
    import io

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.calibrate import dispatch_classes
    from autoplan.calibrate.progress import Progress
    from autoplan.calibrate.sizes import sweep_for
    from autoplan.calibrate.timing import Timer

    add = next(case for case in _CASES if case.op == aten.add.Tensor)
    no_rule = dispatch_classes._Case(aten.renorm.default, lambda x: torch.renorm(x, 2, 0, 1.0), lambda i: (i.activation(8, 8),))
    monkeypatch.setattr(dispatch_classes, "_CASES", (no_rule, add))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        stream = io.StringIO()
        samples = dispatch_classes.measure_op_classes(mesh, Timer(torch.device("cpu"), sweep_for("cpu", True)), Progress(2, True, stream))
    finally:
        dist.destroy_process_group()
    assert [s.op for s in samples] == ["aten.add.Tensor"]
    assert "aten.renorm.default: DTensor cannot run it here, skipped" in stream.getvalue()
