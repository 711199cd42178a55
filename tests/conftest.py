import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def example_module(filename: str):
    """An example file imported as a module, to build its model on a real device."""
    from autoplan.model_file import import_model_file

    return import_model_file(EXAMPLES / filename)


# Bound now, before any test puts benchmarks/ (which has a zoo.py of its own) ahead of tests/ on
# sys.path: which file ``from zoo import ...`` found depended on the order files were collected in.
import zoo  # noqa: E402,F401


def pytest_configure(config):
    """Each test file's line as it finishes, the slowest files at the end (``file_progress.py``)."""
    from file_progress import FileProgress

    config.pluginmanager.register(FileProgress(config), "file_progress")


def pytest_collection_modifyitems(items):
    """Tests that spawn gloo processes belong to the slow lane too."""
    for item in items:
        if item.get_closest_marker("gloo") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def fake_mesh_2x4():
    """A 2x4 ("dp", "tp") mesh of a fake process group of 8 ranks, this process rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(autouse=True, scope="session")
def fresh_plan_cache():
    """Every test session starts with an empty plan cache of its own, outside the checkout:
    tests that plan must really plan, and must not leave entries in plans_out/."""
    with tempfile.TemporaryDirectory(prefix="autoplan-cache-") as directory:
        previous = os.environ.get("AUTOPLAN_CACHE_DIR")
        os.environ["AUTOPLAN_CACHE_DIR"] = directory
        yield Path(directory)
        if previous is None:
            os.environ.pop("AUTOPLAN_CACHE_DIR", None)
        else:
            os.environ["AUTOPLAN_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def sharding_decisions_of_this_test_only():
    """Tests create and destroy process groups one after another in one process. A new 2x4
    mesh compares equal to the destroyed one before it, so a sharding decision cached for
    the earlier mesh (by DTensor, or by autoplan's own cache) would hand this test specs
    that name dead process groups ("Could not resolve the process group"). A training
    process keeps its process groups; between tests, the caches start empty."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    from autoplan.dtensor import overrides

    if not overrides._depth:
        _clear_sharding_prop_cache()
        overrides._own_cache = None
    yield
