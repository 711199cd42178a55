"""Why MFU is what it is: the plan splits its predicted compute by what it is made of (the
cost stage's own per-op figures), and ``show`` splits the step into the model's FLOPs at
peak (MFU's share) and the rest, adding up to the step, whatever the speed-up."""

import dataclasses
import io
import json

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.choices.graph import OP
from autoplan.cli import main
from autoplan.cost.estimate import COMPUTE_PARTS, compute_part_rows
from autoplan.explain.mfu import step_rows
from autoplan.explain.render import render
from autoplan.explain.show import show_sections, summarize
from autoplan.model_file import load_model_file
from autoplan.pipeline.problem import prepare_problem
from autoplan.plan.module_plan import COMPUTE_SPLIT


@pytest.fixture(scope="module")
def plans():
    """The tiny Llama (replicated: 1.0x) and the tiny MLP (split, about 1.1x) on 2x4, h100-sxm."""
    found = {}
    for name in ("llama", "mlp"):
        loaded = load_model_file(str(EXAMPLES / f"{name}.py"))
        found[name] = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), broadcast=False, cache=False)
    return found


@pytest.mark.parametrize("profile", ["h100-sxm", "cpu-gloo"])
def test_every_ops_compute_parts_add_up_to_its_compute(profile):
    # h100-sxm overlaps the host's dispatch with the kernel (an op costs the larger), cpu-gloo
    # runs them one after the other (the sum): both split exactly
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    problem = prepare_problem(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), profile)
    checked = 0
    for name, cost in problem.costed.nodes.items():
        rows = compute_part_rows(cost)
        assert len(rows) == len(COMPUTE_PARTS)
        for i, total in enumerate(cost.compute_s):
            parts = [row[i] for row in rows]
            assert min(parts) >= 0, (name, i, parts)
            assert sum(parts) == pytest.approx(total, rel=1e-9, abs=1e-15), (name, i, parts)
            checked += total > 0
    assert checked > 100
    dispatch = COMPUTE_PARTS.index("dispatch_s")
    graph = problem.costed.choices.graph
    pairs = [(compute_part_rows(c)[dispatch][i], total) for name, c in problem.costed.nodes.items()
             if graph.decision(name).kind == OP for i, total in enumerate(c.compute_s)]
    # somewhere the host's fixed time is more than the kernel's (views at least) ...
    assert any(seconds > 0 for seconds, _ in pairs)
    # ... and where it overlaps the device, some kernel (a whole op's matmul) hides it entirely
    assert any(seconds == 0 and total > 0 for seconds, total in pairs) == (profile == "h100-sxm")


def test_the_plan_stores_its_compute_split_adding_up_to_its_compute(plans, tmp_path):
    for name, plan in plans.items():
        split = plan.predicted.compute_split
        assert set(split) == set(COMPUTE_SPLIT)
        assert all(seconds >= 0 for seconds in split.values())
        assert sum(split.values()) == pytest.approx(plan.predicted.compute_s, rel=1e-5), name  # 6 digits each
        assert split["optimizer_s"] > 0 and split["dispatch_s"] > 0
        path = tmp_path / f"{name}.json"
        plan.save(path)
        assert autoplan.Plan.load(path).predicted.compute_split == split


def _rendered(plan) -> str:
    out = io.StringIO()
    render(show_sections(summarize(plan)), out)
    return out.getvalue()


def test_show_splits_the_step_into_the_models_flops_and_the_rest_at_any_speed_up(plans):
    for name, plan in plans.items():
        summary = summarize(plan)
        rows = step_rows(summary)
        # the rows add up to the step, and the first one's share is the MFU
        assert sum(seconds for _, seconds in rows) == pytest.approx(plan.predicted.step_time_s, rel=1e-5), name
        assert rows[0][0].startswith("model FLOPs at peak")
        assert rows[0][1] / plan.predicted.step_time_s == pytest.approx(summary.mfu, rel=1e-9)
        assert rows[-1][1] == plan.predicted.comm_s
        text = _rendered(plan)
        assert "model FLOPs utilisation: where the step goes" in text
        assert "host dispatch beyond the kernels" in text and "memory-bound kernels" in text
        assert f"predicted MFU {summary.mfu:.1%}" in text
        shown = [line.split() for line in text.splitlines() if line.startswith("  step ")]
        assert shown and shown[0][1] == f"{plan.predicted.step_time_s * 1e3:.3f}"
    # the replicated tiny Llama at this size: most of its step is the host's per-op dispatch
    llama = summarize(plans["llama"])
    assert llama.all_replicated
    largest = max(step_rows(llama)[1:], key=lambda row: row[1])
    assert largest[0].startswith("host dispatch")
    assert "the largest part beside the model's FLOPs: host dispatch" in _rendered(plans["llama"])


def test_show_json_carries_the_split(plans, tmp_path, capsys):
    plan = plans["mlp"]
    path = tmp_path / "mlp.json"
    plan.save(path)
    assert main(["show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["compute_split"] == plan.predicted.compute_split
    assert data["model_flops_at_peak_s"] == pytest.approx(data["mfu"] * data["step_time_s"], rel=1e-9)


def test_a_plan_written_before_the_split_still_adds_up(plans):
    plan = plans["mlp"]
    old = dataclasses.replace(plan, predicted=dataclasses.replace(plan.predicted, compute_split={}))
    rows = step_rows(summarize(old))
    assert [seconds for _, seconds in rows] == [plan.predicted.compute_s, plan.predicted.comm_s]
    assert "predates the split" in _rendered(old)


def test_mfu_counts_attentions_products(plans):
    """12 x batch x heads x queries x keys x head_dim per attention call (PaLM's count): the
    tiny Llama's 2 layers of 4 heads of 16 over 8 sequences of 32 tokens."""
    plan = plans["llama"]
    assert plan.attention_flops == 12 * 8 * 4 * 32 * 32 * 16 * 2
    assert plans["mlp"].attention_flops == 0
    summary = summarize(plan)
    assert "with attention's products" in summary.mfu_note
    plain = summarize(dataclasses.replace(plan, attention_flops=0.0))
    assert summary.model_flops == pytest.approx(plain.model_flops + plan.attention_flops)
    assert step_rows(summary)[0][0].startswith("model FLOPs at peak ((6·N·tokens + attention)")
