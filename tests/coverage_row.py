"""One row of the coverage benchmark (``benchmarks/hf_coverage.py``), run as the benchmark
runs it (``hf_row.run_row``): tiny config as shipped, plans with the default and the
forcing budget, one fake-process-group step each, collectives compared."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import hf_row


def assert_row_runs_the_predicted_collectives(tmp_path: Path, task: str, model_type: str, dtype: str,
                                              shape: tuple[int, int] | None = None) -> dict:
    """The row's record (``hf_row.run_row``); ``shape`` (examples, tokens): the batch, as
    ``hf_coverage.py --shapes`` sets it; else ``hf_tiny``'s."""
    model_file = tmp_path / f"{model_type}.py"
    model_file.write_text(hf_row.hf_model_file_text(task, model_type, shape))
    row = {"task": task, "model_type": model_type, "class": model_type}
    row = hf_row.run_row(row, model_file, [dtype], numerics=False, numerics_max_step_s=0.0, out=tmp_path / "row.json")
    stages = row["stages"]
    assert stages[f"plan {dtype}/forced"]["sharded_every_axis"], stages[f"plan {dtype}/forced"]
    for budget in ("default", "forced"):
        assert stages[f"collectives {dtype}/{budget}"]["ok"], stages[f"collectives {dtype}/{budget}"]
    return row
