"""``suggest(expert_parallel=True)``: the solved plan against its experts split over each mesh
axis, priced by a dry run of each step (the router's load taken as even), the cheaper kept;
``show`` names the expert layout and what the other costs."""

import io
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
def test_tiny_experts_keep_the_solved_layout_and_say_what_the_split_costs():
    example = import_model_file(MIXTRAL)
    model = example.build_model()
    plan = autoplan.suggest(model, example.example_inputs(), mesh=(2, 4), axis_names=("dp", "ep"),
                            profile="cpu-gloo", cache=False, expert_parallel=True)
    assert plan.expert_parallel == {}
    note, = [w for w in plan.warnings if w.startswith(EXPERT_NOTE)]
    assert "keep the solved layout" in note and "(slower)" in note
    assert "experts: in the solved layout" in _shown(plan)
