"""Ops that follow one input also get the strategy that keeps every input's split.

Many DTensor rules written as strategy functions (``cat``, ``stack``, ``where`` ...) build
their strategies by following one input: each input's placement in turn becomes the
placement every input and the output take. At run time each input has one placement, so
``cat([cls (S(2), R), patches (R, S(0))])`` on a dp x tp mesh is offered ``(S(2), R)`` and
``(R, S(0))`` only, and either one gathers an input. The planner reads the same rule with
every placement of the first input (``strategies.py``) and so also knows ``(S(2), S(0))``,
which only slices each input where the other one is split: nothing moves. It plans that
one where it is cheapest, and DTensor, never offered it, gathers instead.

``merged`` wraps such a rule (``overrides.py`` installs it for every strategy function):
where the inputs arrive split on different mesh axes, and each axis has at most one way
of splitting among them, the rule is asked once more with every input in that merged
layout, and its strategies for it are offered too, priced from the layouts the inputs
arrive in. DTensor's selection then takes it when it is the cheapest, as the plan did.
Not for an in-place op whose self would be split otherwise than it arrives: DTensor
runs the op on a slice and re-labels self with the output's layout, its memory whole
(DeepSeek V4's ``block_bias.scatter_(-1, index, 0)``, a whole bias and an index split by
batch, left a bias labelled split whose local tensor was the whole one).
"""

from __future__ import annotations

from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops.utils import generate_redistribute_costs


def merged(rule, diverged=lambda: None):
    """DTensor's strategy function ``rule``, also offering the merged layout of its inputs;
    ``diverged()`` is called whenever that adds a strategy."""

    def strategy(op_schema: OpSchema):
        result = rule(op_schema)
        if not isinstance(result, OpStrategy):
            return result
        arrivals = _tensor_inputs(op_schema)
        placements = _merged_placements(arrivals)
        if placements is None or (op_schema.is_inplace_op() and placements != _arrival(arrivals[0])):
            return result  # an in-place op keeps its self as it is: DTensor re-labels, never moves, it
        known = {_input_placements(spec) for spec in result.strategies}
        if (placements,) * len(arrivals) in known:
            return result
        try:
            offered = rule(_with_placements(op_schema, placements))
        except (AssertionError, NotImplementedError, RuntimeError, ValueError, IndexError):
            return result  # the rule takes no input in that layout
        added = [
            OpSpec(spec.output_specs, spec.input_specs, redistribute_cost=[
                generate_redistribute_costs(arrival, wanted) for arrival, wanted in zip(arrivals, spec.input_specs)
            ])
            for spec in getattr(offered, "strategies", ())
            if _input_placements(spec) == (placements,) * len(arrivals)
        ]
        if not added:
            return result
        diverged()
        return OpStrategy(list(result.strategies) + added)

    return strategy


def _tensor_inputs(op_schema: OpSchema) -> list[OpStrategy]:
    """Each tensor input's strategy, in the order the op's input specs list them."""
    found = []
    for arg in op_schema.args_schema:
        if isinstance(arg, OpStrategy):
            found.append(arg)
        elif isinstance(arg, TupleStrategy):
            found.extend(child for child in arg.children if isinstance(child, OpStrategy))
    return found


def _arrival(strategy: OpStrategy) -> tuple:
    return tuple(strategy.strategies[0].output_spec.placements)


def _input_placements(spec: OpSpec) -> tuple | None:
    if spec.input_specs is None:
        return None
    return tuple(tuple(s.placements) for s in spec.input_specs)


def _merged_placements(arrivals: list[OpStrategy]) -> tuple | None:
    """The one layout that keeps every input's split (each input as it arrives, split on
    the axes where another input is split, the same way); None where there is none, or
    where the inputs already arrive alike."""
    if len(arrivals) < 2 or any(len(a.strategies) != 1 for a in arrivals):
        return None
    specs = [a.strategies[0].output_spec for a in arrivals]
    if len({spec.ndim for spec in specs}) != 1 or len({tuple(s.placements) for s in specs}) == 1:
        return None
    mesh = specs[0].mesh
    merged: list[Placement] = []
    for axis in range(mesh.ndim):
        splits = {spec.placements[axis] for spec in specs} - {Replicate()}
        if not splits:
            merged.append(Replicate())
            continue
        if len(splits) != 1:
            return None
        (split,) = splits
        if type(split) is not Shard:
            return None  # partial values and strided splits stay DTensor's to decide
        size = mesh.size(axis)
        if any(spec.tensor_meta is None or spec.tensor_meta.shape[split.dim] % size for spec in specs):
            return None  # an uneven split, which the planner never plans
        merged.append(split)
    return tuple(merged)


def _with_placements(op_schema: OpSchema, placements: tuple) -> OpSchema:
    """``op_schema`` with every tensor input arriving in ``placements``."""

    def moved(arg):
        if isinstance(arg, OpStrategy):
            spec = arg.strategies[0].output_spec
            return OpStrategy([OpSpec(DTensorSpec(spec.mesh, placements, tensor_meta=spec.tensor_meta))])
        if isinstance(arg, TupleStrategy):
            return TupleStrategy([moved(child) for child in arg.children])
        return arg

    return OpSchema(
        op_schema.op,
        tuple(moved(arg) for arg in op_schema.args_schema),
        op_schema.kwargs_schema,
        schema_info=op_schema.schema_info,
    )
