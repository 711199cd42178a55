import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
_RUN_CACHE = pytest.StashKey[tuple]()
sys.path.insert(0, str(Path(__file__).resolve().parent))


def example_module(filename: str):
    """An example file imported as a module, to build its model on a real device."""
    from autoplan.model_file import import_model_file

    return import_model_file(EXAMPLES / filename)


# Bound now, before any test puts benchmarks/ (which has a zoo.py of its own) ahead of tests/ on
# sys.path: which file ``from zoo import ...`` found depended on the order files were collected in.
import zoo  # noqa: E402,F401


def pytest_configure(config):
    """Every test run starts with an empty plan cache of its own, outside the checkout: tests
    that plan must really plan, and must not leave entries in plans_out/. Made here, before
    xdist starts its workers, so that they all inherit it: a question one file's worker
    solved (the zoo's forced plans, asked by several files) is answered from the cache in
    another's, as it is within one worker. Tests that must solve pass ``cache=False``.

    Also: each test file's line as it finishes, the slowest files at the end
    (``file_progress.py``); under ``--dist loadfile``, the slowest files handed out first
    (``file_schedule.py``)."""
    from file_progress import FileProgress
    from file_schedule import SlowestFilesFirst

    config.pluginmanager.register(FileProgress(config), "file_progress")
    if not hasattr(config, "workerinput"):  # the xdist controller, or a run without xdist
        config.pluginmanager.register(SlowestFilesFirst(), "file_schedule")
        config.stash[_RUN_CACHE] = (tempfile.mkdtemp(prefix="autoplan-cache-"), os.environ.get("AUTOPLAN_CACHE_DIR"))
        os.environ["AUTOPLAN_CACHE_DIR"] = config.stash[_RUN_CACHE][0]


def pytest_unconfigure(config):
    if _RUN_CACHE in config.stash:
        directory, previous = config.stash[_RUN_CACHE]
        shutil.rmtree(directory, ignore_errors=True)
        if previous is None:
            os.environ.pop("AUTOPLAN_CACHE_DIR", None)
        else:
            os.environ["AUTOPLAN_CACHE_DIR"] = previous


def pytest_collection_modifyitems(items):
    """Tests that spawn gloo processes belong to the slow lane too, and to tests/integration:
    the unit lane stays a lane of seconds."""
    unit = Path(__file__).resolve().parent / "unit"
    for item in items:
        if item.get_closest_marker("gloo") is not None:
            item.add_marker(pytest.mark.slow)
            if unit in item.path.parents:
                raise pytest.UsageError(f"{item.nodeid} spawns gloo processes: move it under tests/integration/")


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


@pytest.fixture(scope="session")
def fresh_plan_cache():
    """The test run's plan cache (``pytest_configure``)."""
    return Path(os.environ["AUTOPLAN_CACHE_DIR"])


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
