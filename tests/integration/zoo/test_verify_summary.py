"""``Verification`` reads as what it found: ``str()`` the verdict with the count of
collectives, ``repr()`` the counts rather than a bare ``rows=()`` (``verify/step_check.py``)."""

import math

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.step_check import compare, verify_plan


def _table(**cells):
    """module -> axis -> kind -> {"count", "bytes"} from ``module__axis__kind=(count, bytes)``."""
    table: dict = {}
    for key, (count, nbytes) in cells.items():
        module, axis, kind = key.split("__")
        table.setdefault(module, {}).setdefault(axis, {})[kind] = {"count": count, "bytes": nbytes}
    return table


def test_a_pass_says_how_many_collectives_ran_as_predicted():
    table = _table(mlp__dp__all_reduce=(2, 4096), head__tp__all_gather=(145, 800))
    result = compare(table, table)
    assert result.passed
    assert str(result) == "verified: 147 collectives as predicted"
    assert repr(result).startswith("Verification(passed=True, predicted=147 collectives, observed=147, mismatched_kinds=0")


def test_a_step_with_no_collectives_says_so():
    result = compare({}, {})
    assert result.passed and result.rows == ()
    assert str(result) == "verified: no collectives predicted and none ran"
    assert "predicted=0 collectives, observed=0" in repr(result)


def test_a_failure_says_what_differs():
    result = compare(_table(mlp__dp__all_reduce=(2, 4096)), _table(mlp__dp__all_reduce=(3, 6144)))
    assert not result.passed
    assert str(result) == "NOT verified: 1 of 1 kinds per axis differ (2 collectives predicted, 3 ran)"
    assert repr(result).startswith("Verification(passed=False, predicted=2 collectives, observed=3, mismatched_kinds=1")


def test_collectives_in_another_module_are_counted_in_the_verdict():
    result = compare(_table(mlp__dp__all_reduce=(1, 64)), _table(root__dp__all_reduce=(1, 64)))
    assert result.passed and str(result) == "verified: 1 collective as predicted (2 module rows ran in another module than predicted)"


@pytest.fixture
def fake_world():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


def test_a_real_step_reads_as_its_verdict(fake_world):
    from autoplan.verify.numerics import build_seeded, seeded_batch

    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2,), axis_names=("dp",), profile="cpu-gloo",
                            cache=False, broadcast=False)
    module = import_model_file(loaded.path)
    result = verify_plan(build_seeded(module, "build_model", 0), seeded_batch(module, 1), plan, fake_world)
    predicted, observed = result.counts()
    assert result.passed and predicted == observed
    assert predicted == sum(e["count"] for kinds in plan.predicted.collectives.values() for e in kinds.values())
    expected = f"verified: {predicted} collective{'s' if predicted != 1 else ''} as predicted" if predicted else \
        "verified: no collectives predicted and none ran"
    assert str(result).startswith(expected)
    assert repr(result).startswith(f"Verification(passed=True, predicted={predicted} collectives, observed={observed}")
    assert math.isfinite(result.loss)
