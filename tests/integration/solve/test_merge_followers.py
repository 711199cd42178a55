"""Merging followers shrinks the ILP without changing its optimum.

Before followers kept the layout they are handed, the tiny Llama on 2x4 solved 4 % above
the unmerged optimum: its rotary cos/sin were sliced to save a nanosecond and gathered
again by every consumer.
"""

import pytest
from zoo import example_path

from autoplan.choices.graph import build_choices
from autoplan.cost.estimate import estimate_costs
from autoplan.cost.profile import load_profile
from autoplan.model_file import load_model_file
from autoplan.solve.ilp import solve
from autoplan.solve.simplify import merge_followers
from autoplan.trace.tracer import trace_model

# How much smaller merging makes each problem at least. The tiny Llama's was 3x (12,370 of
# 37,356 variables) while the trace built a causal mask the eager step never makes: its 48
# mask ops merged away almost whole. Without them (trace/known_values.py knows arange's
# positions) merging leaves 12,166 of 31,592 variables, 2.6x.
SHRINK = {"llama": 2.5, "gpt2": 3}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_merged_problem_has_the_unmerged_optimum(name):
    loaded = load_model_file(example_path(name))
    profile = load_profile(None)
    choices = build_choices(trace_model(loaded.model, loaded.example_inputs), (2, 4), ("dp", "tp"))
    costed = estimate_costs(choices, profile)
    simplified = merge_followers(costed)

    merged = solve(simplified.costed, profile.memory_bytes)
    unmerged = solve(costed, profile.memory_bytes)

    assert merged.status == unmerged.status == "optimal"
    assert merged.variables < unmerged.variables / SHRINK[name]
    assert merged.objective_s == pytest.approx(unmerged.objective_s, rel=1e-9)
