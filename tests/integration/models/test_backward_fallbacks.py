"""An op planned replicated for want of a rule has its backward ops replicated too, whatever
their names; and an op without a rule on values the model builds itself runs replicated.

ConvBERT's span convolution gathers each token's neighbours with ``F.unfold``, which runs
as ``im2col``: no DTensor rule, so the plan runs it replicated (``fallback_ops``). Its
backward is ``col2im``, not ``im2col_backward``, so the fallback rules, which looked for
the latter, left it without one, and the planned step failed in the backward ("Operator
aten.col2im.default does not have a sharding strategy registered"). The ops a backward
runs are read off a run of it on meta tensors (``trace/backward_run.py``).

TAPAS reduces its token type ids by segment (``scatter_reduce``) on values it builds
itself: replicated on every rank, planned without a decision, but they reach DTensor at
run time through its embeddings' module boundary, and the op has no rule ("Operator
aten.scatter_reduce.two does not have a sharding strategy registered").
"""

import sys

import pytest
from conftest import ROOT
from zoo import verify_on_fake_world

import autoplan
from autoplan.model_file import import_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"


@pytest.mark.slow  # plans and steps the model on a fake process group
def test_unfold_and_its_backward_run_replicated_as_predicted():
    models = import_model_file(MODEL_FILE)
    plan = autoplan.suggest(build_seeded(models, "convbert", 0), seeded_batch(models, 1), mesh=(2, 4), axis_names=("dp", "tp"))
    assert {"aten.im2col.default", "aten.col2im.default"} <= set(plan.fallback_ops), plan.fallback_ops
    result = verify_on_fake_world(build_seeded(models, "convbert", 0), seeded_batch(models, 1), plan)
    assert result.passed, "\n" + result.summary()


@pytest.mark.slow  # plans and steps the model on a fake process group
def test_an_op_on_values_the_model_builds_runs_replicated_without_a_rule(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import hf_row

    model_file = tmp_path / "tapas.py"
    model_file.write_text(hf_row.hf_model_file_text("masked_lm", "tapas"))
    models = import_model_file(model_file)
    plan = autoplan.suggest(build_seeded(models, "build_model", 0), seeded_batch(models, 1), mesh=(2, 4), axis_names=("dp", "tp"))
    assert "aten.scatter_reduce.two" in plan.fallback_ops, plan.fallback_ops
    result = verify_on_fake_world(build_seeded(models, "build_model", 0), seeded_batch(models, 1), plan)
    assert result.passed, "\n" + result.summary()
