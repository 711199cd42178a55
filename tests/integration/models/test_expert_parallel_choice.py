"""``suggest(expert_parallel=True)``: the experts' layout a decision of the solver (split over a
mesh axis or whole, ``choices/expert_layouts.py``), priced by a dry run of the chosen step (the
router's load taken as even), against the plan of the experts as their own ops; the cheaper
kept; ``show`` names the expert layout and what the other costs."""

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autoplan
from autoplan.explain.render import render
from autoplan.explain.show import show_sections, summarize
from autoplan.model_file import import_model_file
from autoplan.plan.expert_parallel import EXPERT_NOTE

MIXTRAL = Path(__file__).resolve().parents[3] / "examples" / "moe.py"


def _shown(plan) -> str:
    out = io.StringIO()
    render(show_sections(summarize(plan)), out)
    return out.getvalue()


@pytest.mark.slow
def test_wide_experts_are_split_over_an_axis_when_that_is_cheaper():
    # Mixtral-8x7B's widths (8 experts of 14336 x 4096), two layers, 8 x 2048 tokens, bf16, on meta
    example = import_model_file(MIXTRAL)
    with torch.device("meta"):
        model = example.make_big()
        batch = example.example_inputs()
    plan = autoplan.suggest(model, batch, mesh=(2, 4), axis_names=("dp", "ep"), profile="h100-sxm", cache=False,
                            expert_parallel=True)
    assert set(plan.expert_parallel) == {f"model.layers.{i}.mlp.experts" for i in range(2)}
    note, = [w for w in plan.warnings if w.startswith(EXPERT_NOTE)]
    chosen, other = (float(x.split(" ms")[0].split()[-1]) for x in note.split("; their solved layout: "))
    assert chosen == pytest.approx(plan.predicted.step_time_s * 1e3, abs=1e-3) and chosen < other
    assert plan.solver.objective == plan.predicted.step_time_s  # one price
    table = {m: axes for m, axes in plan.predicted.module_collectives.items() if m in plan.expert_parallel}
    for axes in table.values():
        assert axes[plan.expert_parallel["model.layers.0.mlp.experts"]["axis"]]["all_to_all"]["count"] == 5
    shown = _shown(plan)
    assert "expert parallel (experts split over a mesh axis" in shown and "their solved layout" in shown
    again = autoplan.Plan.from_dict(__import__("json").loads(plan.to_json()))
    assert again.to_json() == plan.to_json()


@pytest.mark.slow
def test_tiny_experts_are_not_split_and_the_note_says_what_the_other_planning_costs():
    # the experts' layout is the solver's (split over an axis or whole), against the plan of them as their ops
    example = import_model_file(MIXTRAL)
    model = example.build_model()
    plan = autoplan.suggest(model, example.example_inputs(), mesh=(2, 4), axis_names=("dp", "ep"),
                            profile="cpu-gloo", cache=False, expert_parallel=True)
    assert plan.expert_parallel == {}
    note, = [w for w in plan.warnings if w.startswith(EXPERT_NOTE)]
    kept, other = (float(x.split(" ms")[0].split()[-1]) for x in note.split("; ", 1))
    assert kept == pytest.approx(plan.predicted.step_time_s * 1e3, abs=1e-3) and kept < other, note
    assert "experts: in the solved layout" in _shown(plan)


SPLIT_ONLY_BUDGET_BYTES = 1_500_000
"""Tiny Mixtral, 2x4 cpu-gloo: its experts whole on every rank need 1.8 MB per device at least."""


@pytest.mark.slow
def test_the_solver_splits_the_experts_where_only_that_fits_the_budget(tmp_path):
    # the experts' layout is a decision of the ILP (``choices/expert_layouts.py``): whole, or split over an axis
    from autoplan.choices.expert_layouts import expert_axis, is_expert_region
    from autoplan.errors import InfeasibleError
    from autoplan.pipeline.pinning import Pins
    from autoplan.pipeline.problem import prepare_problem, solve_problem

    example = import_model_file(MIXTRAL)
    model, batch = example.build_model(), example.example_inputs()
    problem = prepare_problem(model, batch, (2, 4), ("dp", "ep"), "cpu-gloo",
                              memory_gib=SPLIT_ONLY_BUDGET_BYTES / 2**30, expert_regions=True)
    graph = problem.choices.graph
    regions = [d.name for d in graph.decisions() if is_expert_region(d.fx_node, problem.traced.opaque_reasons)]
    assert len(regions) == 2  # one per layer
    whole = Pins(problem)
    for name in regions:
        whole.require(name, lambda s: expert_axis(s) is None, "the experts whole", strict=True)
    with pytest.raises(InfeasibleError):
        solve_problem(problem, whole)
    plan, _, fits = solve_problem(problem, Pins(problem), reprice=True)
    assert fits and plan.predicted.peak_memory_bytes <= SPLIT_ONLY_BUDGET_BYTES
    assert set(plan.expert_parallel) == {f"model.layers.{i}.mlp.experts" for i in range(2)}
    assert plan.solver.objective == plan.predicted.step_time_s  # one price: the dry run of the split step
    for fqn, layout in plan.expert_parallel.items():
        counted = plan.predicted.module_collectives[fqn][layout["axis"]]["all_to_all"]["count"]
        assert counted == 5  # counts, dispatch and combine, and the two exchanges of the backward
    kept = autoplan.suggest(model, batch, mesh=(2, 4), axis_names=("dp", "ep"), profile="cpu-gloo", cache=False,
                            memory_gb=SPLIT_ONLY_BUDGET_BYTES / 1e9, expert_parallel=True)
    assert kept.expert_parallel and kept.predicted.peak_memory_bytes <= SPLIT_ONLY_BUDGET_BYTES
    note, = [w for w in kept.warnings if w.startswith(EXPERT_NOTE)]
    assert "no layout of them as their own ops fits the budget" in note, note
    # its prediction is the dry run of its step: ``verify`` counts the same collectives (the exchanges as
    # all_to_all); planned and verified by the command line, which builds the model from its file alike
    saved = tmp_path / "plan.json"
    for command in (["suggest", str(MIXTRAL), "--mesh", "2x4", "--axis-names", "dp,ep", "--profile", "cpu-gloo",
                     "--memory-gb", str(SPLIT_ONLY_BUDGET_BYTES / 1e9), "--expert-parallel", "--no-cache",
                     "--out", str(saved)],
                    ["verify", str(MIXTRAL), str(saved)]):
        run = subprocess.run([sys.executable, "-m", "autoplan", *command], capture_output=True, text=True,
                             cwd=MIXTRAL.parents[1])
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert autoplan.Plan.from_dict(__import__("json").loads(saved.read_text())).expert_parallel
    assert "collectives: passed" in run.stdout, run.stdout[-2000:]
