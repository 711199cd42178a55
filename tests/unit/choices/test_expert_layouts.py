"""The layouts an experts region may take (``choices/expert_layouts.py``) and what each costs beside an op's."""

import torch
from torch import fx

from autoplan.choices.expert_layouts import expert_axis, expert_strategies, is_expert_region, region_costs
from autoplan.trace.opaque import DATA_DEPENDENT, EXPERTS, OPAQUE_OP

TOKENS, HIDDEN, TOP_K, EXPERTS_N, INNER = 16, 8, 2, 4, 6


def _region() -> fx.Node:
    graph = fx.Graph()
    values = {
        "hidden": torch.empty(TOKENS, HIDDEN, device="meta"),
        "index": torch.empty(TOKENS, TOP_K, dtype=torch.int64, device="meta"),
        "weights": torch.empty(TOKENS, TOP_K, device="meta"),
        "gate_up": torch.empty(EXPERTS_N, 2 * INNER, HIDDEN, device="meta"),
        "down": torch.empty(EXPERTS_N, HIDDEN, INNER, device="meta"),
    }
    inputs = []
    for name, value in values.items():
        node = graph.placeholder(name)
        node.meta["val"] = value
        inputs.append(node)
    return graph.call_function(OPAQUE_OP, ("layers.0.experts", inputs))


def test_the_region_is_whole_or_split_over_an_axis_that_divides_the_experts():
    node = _region()
    assert is_expert_region(node, {"layers.0.experts": EXPERTS})
    assert not is_expert_region(node, {"layers.0.experts": DATA_DEPENDENT})
    strategies = expert_strategies(node, (2, 4))
    whole, *split = strategies
    assert expert_axis(whole) is None and set(whole.inputs) == {("R", "R")}
    # over axis 0 or 1 (both divide 4 experts), the rows split or whole on the other
    assert sorted((expert_axis(s), s.outputs[0]) for s in split) == [
        (0, ("S(0)", "R")), (0, ("S(0)", "S(0)")), (1, ("R", "S(0)")), (1, ("S(0)", "S(0)"))]
    for strategy in split:
        axis = expert_axis(strategy)
        rows, params = strategy.inputs[0], strategy.inputs[3]
        assert strategy.inputs[:3] == (rows,) * 3 and strategy.inputs[4] == params
        assert params == tuple("S(0)" if a == axis else "R" for a in range(2))
    assert len(expert_strategies(node, (3, 4))) == 1 + 1  # 3 does not divide 4 experts, 16 rows not by 12


def test_a_split_layout_pays_the_token_exchange_and_keeps_its_rows():
    node = _region()
    split = next(s for s in expert_strategies(node, (2, 4)) if expert_axis(s) == 1 and s.outputs[0] == ("S(0)", "S(0)"))
    costs = region_costs(node, split, (2, 4), requires_grad=True)
    rows = TOKENS // 8
    buffer = rows * TOP_K * HIDDEN * 4
    assert sorted(costs.collectives) == sorted([("all_to_all", 1, float(EXPERTS_N * 8), False)]
                                               + [("all_to_all", 1, buffer, False)] * 2
                                               + [("all_to_all", 1, buffer, True)] * 2)
    assert costs.held_bytes == rows * TOP_K * (2 * INNER + HIDDEN + HIDDEN + INNER) * 4
    whole = region_costs(node, expert_strategies(node, (2, 4))[0], (2, 4), requires_grad=True)
    assert whole.collectives == () and whole.held_bytes == costs.held_bytes * 8
