import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def example_module(filename: str):
    """An example file imported as a module, to build its model on a real device."""
    from autoplan.model_file import import_model_file

    return import_model_file(EXAMPLES / filename)
