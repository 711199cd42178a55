"""The compile regime (``cost/regime.py``) as the cost stage prices it.

On the hand-exact profile of ``test_mlp_optimum`` (work, traffic and links pure
arithmetic) with eager and compiled fixed costs set, an op inside a compiled graph must
pay exactly the compiled figures instead of the eager ones, fused classes (views,
elementwise) none, and each compiled graph's first op its graph's call; per block, the
ops of the repeated layers are compiled, one call per layer, the rest eager.
"""

import dataclasses
import json

import pytest
import torch
from test_mlp_optimum import FREE_DISPATCH, MeanSquareMLP, exact_profile
from torch import nn

from autoplan.choices.graph import OP, build_choices
from autoplan.cost.estimate import estimate_costs, graph_heads
from autoplan.cost.op_classes import op_class
from autoplan.cost.profile import (
    FUSED_CLASSES,
    GRAPH_CALL_OPS,
    CompiledCost,
    load_profile,
    profile_from_dict,
    profile_path,
)
from autoplan.cost.regime import EAGER, Regime, check_regime, regime_for, regime_mismatch
from autoplan.errors import OptionError, ProfileError
from autoplan.trace.repeats import find_repeated_blocks
from autoplan.trace.tracer import trace_model

EAGER_FIXED = {"forward_op_s": 3e-4, "backward_op_s": 7e-4}
COMPILED = {"forward_op_s": 2e-5, "backward_op_s": 5e-5, "graph_call_s": 1.5e-3, "fused_traffic": 0.25}


class Stack(nn.Module):
    """Three alike layers in a ModuleList (a repeated stack) and a head outside it."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(d, d)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).pow(2).mean()


def _profile(compiled=True):
    return exact_profile({**FREE_DISPATCH, **EAGER_FIXED, **({"compiled": COMPILED} if compiled else {})})


def _costed(model, regime=EAGER, profile=None, d=64):
    with torch.device("meta"):
        x = torch.randn(8, d)
    choices = build_choices(trace_model(model, (x,)), (4,), ("tp",))
    return estimate_costs(choices, profile or _profile(), regime=regime)


def _ops(costed):
    return [d for d in costed.choices.graph.decisions() if d.kind == OP]


def test_whole_regime_charges_compiled_fixed_costs_and_one_graph_call():
    with torch.device("meta"):
        model = MeanSquareMLP(64)
    eager, whole = _costed(model), _costed(model, Regime("whole"))
    assert eager.regime == "none" and whole.regime == "whole"
    heads = graph_heads(whole.choices, Regime("whole"))
    assert len(heads) == 1
    for decision in _ops(whole):
        name, grad = decision.name, decision.requires_grad
        fused = op_class(decision.fx_node.target) in FUSED_CLASSES
        eager_fixed = EAGER_FIXED["forward_op_s"] + (EAGER_FIXED["backward_op_s"] if grad else 0.0)
        compiled_fixed = 0.0 if fused else COMPILED["forward_op_s"] + (COMPILED["backward_op_s"] if grad else 0.0)
        if name in heads:
            compiled_fixed += COMPILED["graph_call_s"]
        moved = [e - w for e, w in zip(eager.nodes[name].compute_s, whole.nodes[name].compute_s)]
        assert moved == pytest.approx([eager_fixed - compiled_fixed] * len(moved)), name


def test_the_regime_lowers_the_step_and_changes_what_the_solver_sees():
    with torch.device("meta"):
        model = MeanSquareMLP(64)
    eager, whole = _costed(model), _costed(model, Regime("whole"))
    eager_s, whole_s = (sum(min(n.compute_s) for n in c.nodes.values()) for c in (eager, whole))
    assert whole_s < eager_s
    assert whole_s - COMPILED["graph_call_s"] < eager_s / 5  # per op, the eager figures are ~15x the compiled ones


def test_block_regime_compiles_the_layers_alone_one_call_per_layer():
    model = Stack()
    blocks = find_repeated_blocks(model)
    assert blocks is not None and blocks.count == 3
    regime, warning = regime_for("block", blocks)
    assert warning is None
    costed = _costed(model, regime)
    eager = _costed(model)
    owners = costed.choices.traced.node_modules
    heads = graph_heads(costed.choices, regime)
    assert len(heads) == 3  # the model was traced whole: one graph per layer
    assert {blocks.layer_of(owners[h]) for h in heads} == {0, 1, 2}
    compiled_ops = [d.name for d in _ops(costed) if regime.compiled(owners.get(d.name))]
    eager_ops = [d.name for d in _ops(costed) if not regime.compiled(owners.get(d.name))]
    assert compiled_ops and eager_ops
    for name in eager_ops:  # the head and the loss run eagerly
        assert costed.nodes[name].compute_s == eager.nodes[name].compute_s, name
    for name in compiled_ops:
        call = COMPILED["graph_call_s"] if name in heads else 0.0
        assert max(costed.nodes[name].compute_s) - call < max(eager.nodes[name].compute_s), name


def test_block_without_a_repeated_stack_is_priced_whole_with_a_warning():
    regime, warning = regime_for("block", None)
    assert regime.name == "whole" and "no repeated stack" in warning
    assert regime_for("none", None) == (EAGER, None)


def test_fused_ops_keep_the_fused_share_of_their_traffic():
    profile = load_profile("cpu-gloo")
    compiled = CompiledCost(0.0, 0.0, 0.0, 0.25)
    free = dataclasses.replace(profile.dispatch, forward_op_s=0.0, backward_op_s=0.0, op_classes={}, compiled=compiled)
    profile = dataclasses.replace(profile, dispatch=free, kernel_overhead_s=0.0)
    with torch.device("meta"):
        model = MeanSquareMLP(256)
    eager, whole = _costed(model, profile=profile, d=256), _costed(model, Regime("whole"), profile, d=256)
    checked = 0
    for decision in _ops(whole):
        if op_class(decision.fx_node.target) != "elementwise":
            continue
        memory_bound = 2  # COMPUTE_PARTS' memory_bound_s
        for e, w in zip(eager.nodes[decision.name].compute_parts[memory_bound], whole.nodes[decision.name].compute_parts[memory_bound]):
            if e > 0:
                assert w / e == pytest.approx(0.25, rel=0.05), decision.name
                checked += 1
    assert checked


def test_a_profile_without_compiled_figures_derives_them_from_the_eager_ones():
    profile = _profile(compiled=False)
    assert profile.dispatch.compiled is None
    derived = profile.dispatch.compiled_costs(4e-6)
    assert derived.forward_op_s == derived.backward_op_s == 4e-6
    assert derived.graph_call_s == pytest.approx(GRAPH_CALL_OPS * (3e-4 + 7e-4))
    assert not derived.measured
    assert derived.fixed_seconds("view") == (0.0, 0.0) == derived.fixed_seconds("elementwise")
    measured = _profile().dispatch.compiled
    assert measured is not None and measured.graph_call_s == COMPILED["graph_call_s"]


def test_a_compiled_table_out_of_bounds_is_refused():
    raw = json.loads(profile_path("h100-sxm").read_text())
    raw["dispatch"]["compiled"] = {**COMPILED, "fused_traffic": 1.5}
    with pytest.raises(ProfileError, match="fused_traffic"):
        profile_from_dict(raw)


def test_regime_names_and_the_verify_warning():
    assert check_regime("block") == "block"
    with pytest.raises(OptionError, match="compile regime"):
        check_regime("eager")
    assert regime_mismatch("block", "block") is None
    warning = regime_mismatch("none", "block")
    assert "eager DTensor" in warning and "--compile block" in warning
    assert "suggest`" in regime_mismatch("whole", "none")
