"""``suggest`` says what the mesh gains: the speed-up over one device, and why in words when
it is about 1x, for a plan that replicates everything and for one that splits work."""

import io

import pytest
from conftest import EXAMPLES

from autoplan.explain.mesh_gain import GAINS_LITTLE, one_device_seconds
from autoplan.explain.show import ms
from autoplan.model_file import load_model_file
from autoplan.pipeline.cached import HIT, suggest_cached
from autoplan.pipeline.problem import prepare_problem
from autoplan.pipeline.suggest import suggest_with_report


def test_one_device_is_the_replicated_plans_own_step_time():
    # the tiny Llama's best plan replicates everything: every device runs the whole step,
    # which is what one device runs
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan, report = suggest_with_report(loaded.model, loaded.example_inputs, (2, 4))
    assert all(p == "R" for spec in plan.parameters.values() for p in spec)
    assert report.extra["one_device_s"] == pytest.approx(plan.predicted.step_time_s, rel=1e-5)  # the plan keeps 6 digits
    assert plan.predicted.comm_s == 0


def test_a_split_plan_about_as_fast_as_one_device_says_why():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    plan, report = suggest_with_report(loaded.model, loaded.example_inputs, (2, 4))
    p, one = plan.predicted, report.extra["one_device_s"]
    assert any(p != "R" for spec in plan.parameters.values() for p in spec)  # not all replicated
    assert 1 < one / p.step_time_s < GAINS_LITTLE
    out = io.StringIO()
    report.render(out)
    text = " ".join(out.getvalue().split())
    assert f"predicted speed-up over one device {one / p.step_time_s:.2f}x on 8 devices" in text
    assert "the mesh gains little. Why:" in text
    # the compute the split saves and the communication it adds, as the prediction has them
    assert f"saves {ms(one - p.compute_s)} ms of one device's {ms(one)} ms of compute" in text
    assert f"adds {ms(p.comm_s)} ms of communication" in text


def test_one_device_prices_every_op_whole():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    problem = prepare_problem(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"))
    one = one_device_seconds(problem.costed)
    # no op on 8 devices is slower than it is whole: a split strategy can only shrink compute
    assert one > sum(min(cost.compute_s) for cost in problem.costed.nodes.values())


def test_a_cached_plan_keeps_its_one_device_time(tmp_path):
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    _, planned = suggest_cached(loaded.model, loaded.example_inputs, (2, 4), cache_dir=tmp_path)
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    _, reused = suggest_cached(loaded.model, loaded.example_inputs, (2, 4), cache_dir=tmp_path)
    assert reused.extra["cache"] == HIT
    assert reused.extra["one_device_s"] == planned.extra["one_device_s"] > 0
