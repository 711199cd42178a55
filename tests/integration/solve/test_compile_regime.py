"""``suggest(compile=...)``: the step priced in the regime it runs, recorded in the plan.

A small stack of alike layers on a 1-D mesh of 2 with the CPU profile (eager DTensor's
fixed costs dominate such a step): compiled per block the predicted step is cheaper, by
the dispatch the cost stage no longer charges; the plan says which regime it was priced
for, through its file, ``show`` and the plan cache (an eager plan is not a compiled one's).
"""

import json

import pytest
import torch
from torch import nn

import autoplan
from autoplan.errors import OptionError
from autoplan.explain.show import show_sections, summarize
from autoplan.pipeline.cached import suggest_cached
from autoplan.plan.module_plan import Plan

pytestmark = pytest.mark.slow


class Stack(nn.Module):
    def __init__(self, d: int = 32, layers: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(layers)
        )
        self.head = nn.Linear(d, d)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x).pow(2).mean()


def _plan(regime, **options):
    with torch.device("meta"):
        model, x = Stack(), torch.randn(8, 32)
    return autoplan.suggest(model, (x,), mesh=(2,), axis_names=("dp",), profile="cpu-gloo", compile=regime, **options)


def test_compile_changes_the_priced_dispatch_and_is_recorded(tmp_path):
    eager, block, whole = (_plan(regime, cache=False) for regime in ("none", "block", "whole"))
    assert (eager.regime, block.regime, whole.regime) == ("none", "block", "whole")
    dispatch = {p.regime: p.predicted.compute_split["dispatch_s"] for p in (eager, block, whole)}
    # per block, each layer's call remains (about four eager ops' fixed time, derived): a
    # layer of ten ops saves most of its dispatch; whole, one call for the step
    assert dispatch["whole"] < dispatch["block"] < dispatch["none"] / 1.5
    assert dispatch["whole"] < dispatch["none"] / 4
    assert whole.predicted.step_time_s < block.predicted.step_time_s < eager.predicted.step_time_s
    again = Plan.from_dict(json.loads(block.to_json()))
    assert again.regime == "block" and '"regime": "block"' in block.to_json()
    title = show_sections(summarize(block))[0].title
    assert "torch.compile per block" in title


def test_score_prices_a_plan_in_its_own_regime():
    block = _plan("block", cache=False)
    with torch.device("meta"):
        model, x = Stack(), torch.randn(8, 32)
    scored = autoplan.score(model, (x,), block)
    assert scored.step_time_s == pytest.approx(block.predicted.step_time_s, rel=1e-3)


def test_the_plan_cache_keys_on_the_regime(tmp_path):
    with torch.device("meta"):
        model, x = Stack(), torch.randn(8, 32)
    options = dict(mesh=(2,), axis_names=("dp",), profile="cpu-gloo", cache_dir=tmp_path, tie=False)
    first, report = suggest_cached(model, (x,), **options)
    assert report.extra["cache"] == "miss" and first.regime == "none"
    whole, report = suggest_cached(model, (x,), **options, compile="whole")
    assert report.extra["cache"] == "miss" and whole.regime == "whole"
    _, report = suggest_cached(model, (x,), **options, compile="whole")
    assert report.extra["cache"] == "hit"


def test_an_unknown_regime_is_refused_with_the_fix():
    with pytest.raises(OptionError, match="compile regime"):
        _plan("eager", cache=False)
