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


def pytest_collection_modifyitems(items):
    """Tests that spawn gloo processes belong to the slow lane too."""
    for item in items:
        if item.get_closest_marker("gloo") is not None:
            item.add_marker(pytest.mark.slow)


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
