"""The eager-DTensor fixed costs (profile ``dispatch``) as the cost stage charges them.

The hand-exact profile of ``test_mlp_optimum`` makes every other cost pure arithmetic, so
turning on one dispatch figure at a time must move each node's cost, and the optimum,
by exactly that figure times what it counts: forward ops (views included, tensor
factories excluded), backward ops of ops that carry a gradient, and ``AdamW.step()``
per parameter plus its bytes over ``optimizer_bytes_per_s``.
"""

import pytest
import torch
from test_mlp_optimum import FREE, FREE_DISPATCH, MeanSquareMLP, compute_s, exact_profile

import autoplan
from autoplan.choices.graph import CONSTANT, OP, PARAMETER, build_choices
from autoplan.cost.estimate import VIEW_OPS, estimate_costs, tensor_bytes
from autoplan.cost.op_classes import op_class
from autoplan.cost.profile import DispatchCost
from autoplan.trace.tracer import trace_model

D, BATCH = 1024, 8
FORWARD, BACKWARD, PER_PARAM, OPT_BW = 3e-4, 7e-4, 2e-3, 1e9


def costed_mlp(**dispatch):
    with torch.device("meta"):
        model = MeanSquareMLP(D)
        x = torch.randn(BATCH, D)
    choices = build_choices(trace_model(model, (x,)), (4,), ("tp",))
    return estimate_costs(choices, exact_profile({**FREE_DISPATCH, **dispatch}))


def node_kinds(costed):
    return {d.name: (d.kind, d.requires_grad, d.fx_node.target in VIEW_OPS) for d in costed.choices.graph.decisions()}


def test_free_dispatch_leaves_views_and_parameters_free():
    costed = costed_mlp()
    for name, (kind, _, is_view) in node_kinds(costed).items():
        if is_view or kind == PARAMETER:
            assert max(costed.nodes[name].compute_s) == pytest.approx(0.0, abs=1e-18), name


def test_each_op_pays_forward_and_backward_fixed_costs():
    free, charged = costed_mlp(), costed_mlp(forward_op_s=FORWARD, backward_op_s=BACKWARD)
    seen_view = False
    for name, (kind, grad, is_view) in node_kinds(free).items():
        added = [b - a for a, b in zip(free.nodes[name].compute_s, charged.nodes[name].compute_s)]
        if kind == OP:
            expected = FORWARD + (BACKWARD if grad else 0.0)
            assert added == pytest.approx([expected] * len(added)), name
            seen_view |= is_view
        else:  # parameters, inputs, tensor factories: no DTensor op of their own
            assert added == pytest.approx([0.0] * len(added)), name
    assert seen_view  # views are DTensor ops too, and were charged


def test_ops_of_a_class_in_the_table_pay_its_figures_the_rest_the_generic_ones():
    table = {"matmul": {"forward_op_s": 5e-5, "backward_op_s": 2e-4}, "view": {"forward_op_s": 1e-5, "backward_op_s": 4e-5}}
    free = costed_mlp()
    charged = costed_mlp(forward_op_s=FORWARD, backward_op_s=BACKWARD, op_classes=table)
    seen = set()
    for name, (kind, grad, _) in node_kinds(free).items():
        if kind != OP:
            continue
        cls = op_class(free.choices.decision(name).fx_node.target)
        forward, backward = (table[cls]["forward_op_s"], table[cls]["backward_op_s"]) if cls in table else (FORWARD, BACKWARD)
        added = [b - a for a, b in zip(free.nodes[name].compute_s, charged.nodes[name].compute_s)]
        assert added == pytest.approx([forward + (backward if grad else 0.0)] * len(added)), name
        seen.add(cls if cls in table else "generic")
    assert seen == {"matmul", "view", "generic"}  # two matmuls, their transposes, relu/pow/mean


def test_optimizer_pays_per_parameter_and_per_local_byte():
    costed = costed_mlp(optimizer_param_s=PER_PARAM, optimizer_bytes_per_s=OPT_BW)
    graph = costed.choices.graph
    params = [d for d in graph.decisions() if d.kind == PARAMETER]
    assert len(params) == 2
    for param in params:
        full = tensor_bytes(param.fx_node.meta["val"])
        for strategy, seconds in zip(param.strategies, costed.nodes[param.name].compute_s):
            shards = 4 if strategy.outputs[0][0] != "R" else 1
            assert seconds == pytest.approx(PER_PARAM + full / shards / OPT_BW)


def test_tensor_factories_pay_only_the_plain_kernel_overhead():
    costed = costed_mlp(forward_op_s=FORWARD, backward_op_s=BACKWARD)
    constants = [n for n, (kind, _, _) in node_kinds(costed).items() if kind == CONSTANT]
    for name in constants:  # the mean's divisor and the like, built as plain tensors
        assert max(costed.nodes[name].compute_s) == pytest.approx(0.0)


def test_overlapping_device_takes_the_larger_of_host_and_kernel():
    cpu = DispatchCost(1e-4, 3e-4, 1e-5, FREE, overlaps_device=False)
    gpu = DispatchCost(1e-4, 3e-4, 1e-5, FREE, overlaps_device=True)
    assert cpu.op_seconds(1e-4, 4e-6, 5e-4) == pytest.approx(6e-4)
    assert gpu.op_seconds(1e-4, 4e-6, 5e-4) == pytest.approx(5.04e-4)  # kernel-bound: host time hidden
    assert gpu.op_seconds(1e-4, 4e-6, 1e-6) == pytest.approx(1e-4)  # host-bound: the kernel hides
    assert gpu.op_seconds(1e-4, 4e-6, 0.0) == pytest.approx(1e-4)  # a view: host time only


def test_optimum_moves_by_exactly_the_counted_fixed_costs():
    """Column-then-row stays optimal; its step time grows by F x ops + B x grad ops + 2 x AdamW."""
    free_plan = plan(FREE_DISPATCH)
    charged = {**FREE_DISPATCH, "forward_op_s": FORWARD, "backward_op_s": BACKWARD, "optimizer_param_s": PER_PARAM}
    charged_plan = plan(charged)
    assert charged_plan.parameters == free_plan.parameters == {"net.0.weight": ("S(0)",), "net.2.weight": ("S(1)",)}
    kinds = node_kinds(costed_mlp()).values()
    ops = sum(kind == OP for kind, _, _ in kinds)
    grad_ops = sum(kind == OP and grad for kind, grad, _ in kinds)
    assert ops >= 6 and 4 <= grad_ops <= ops  # two matmuls, relu, pow, mean and views at least
    expected = free_plan.predicted.step_time_s + FORWARD * ops + BACKWARD * grad_ops + 2 * PER_PARAM
    assert charged_plan.predicted.step_time_s == pytest.approx(expected, rel=1e-6)
    assert free_plan.predicted.step_time_s == pytest.approx(compute_s(D, BATCH) + 1e-5 + 1.5 * 4 * BATCH * D / 1e10, rel=1e-5)


def plan(dispatch):
    with torch.device("meta"):
        model = MeanSquareMLP(D)
        x = torch.randn(BATCH, D)
    return autoplan.suggest(model, (x,), mesh=(4,), axis_names=("tp",), profile=exact_profile(dispatch))
