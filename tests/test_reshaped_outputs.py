"""A module output that only reshaping views read is moved by the module's output hook.

DTensor moves an op's inputs to the layout the op's strategy wants, but a view's rule
takes its input as it comes and refuses a split it cannot carry through the reshape.
Falcon's fused q/k/v projection (num_heads + 2 heads of 16: 6 on a tiny config) is
viewed as heads right after it; planned leanly, its output is split by columns on tp, and
4 ranks cannot split 6 heads: the step failed ("Cannot unflatten unevenly sharded
tensor"). The plan now hands the projection's output over in the layout the view reads
(``plan/builder.py``), and the apply engine's hook moves it there.
"""

from pathlib import Path

import pytest

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import NumericsJob, build_seeded, check_numerics, seeded_batch
from conftest import ROOT
from zoo import verify_on_fake_world

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


def _suggest(memory_gb):
    loaded = load_model_file(f"{MODEL_FILE}:falcon")
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, memory_gb=memory_gb,
                            cache=False)


@pytest.fixture(scope="module")
def lean_plan():
    """The plan under the least memory any plan needs, plus 2 %: the q/k/v output split on tp."""
    with pytest.raises(InfeasibleError) as refused:
        _suggest(1e-9)
    return _suggest(refused.value.smallest_bytes * 1.02 / 2**30)


@pytest.mark.slow  # plans twice
def test_the_projection_hands_over_what_the_heads_view_reads(lean_plan):
    qkv = lean_plan.modules["transformer.h.0.self_attention.query_key_value"].outputs[""]
    assert qkv[1] != "S(2)", qkv  # 6 heads of the fused projection do not split 4 ways
    module = import_model_file(Path(MODEL_FILE))
    result = verify_on_fake_world(build_seeded(module, "falcon", 0), seeded_batch(module, 1), lean_plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.gloo
def test_matches_one_device_on_gloo(lean_plan):
    [result] = check_numerics([NumericsJob(str(MODEL_FILE), "falcon", lean_plan.to_json())], world=8)
    assert result.loss <= 1e-5, result.loss
    assert max(result.gradients.values()) <= 1e-5, max(result.gradients.items(), key=lambda item: item[1])
