"""Candidate sharding strategies for one ATen op, read from DTensor's own registry.

DTensor keeps three kinds of rules: full strategy functions (``op_strategy_funcs``),
single-mesh-axis rules that it expands to the whole mesh (``op_single_dim_strategy_funcs``),
and a decomposition path. Runtime dispatch asks them "which strategy for *these* input
placements"; a planner needs every strategy. We get them by

- single-axis rules: preparing the rule against a probe schema (one spec per input, with
  a Shard in it so sharding placeholders get filled) and expanding it over the mesh;
- strategy functions: passing, for each tensor input, an ``OpStrategy`` listing every
  candidate placement of that input, so rules that follow their input enumerate them all.

Only strategies whose shards split evenly are kept (uneven sharding is a later issue).
Ops without a rule get ``None`` and the caller falls back to Replicate. The registry is
read with autoplan's rules installed (``overrides.py``; ``build_choices`` installs them).
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.dtensor import loss_parallel
from autoplan.dtensor.strategy import Strategy
from autoplan.placements import (
    Spec,
    candidate_specs,
    fits_evenly,
    is_partial,
    spec_from_placements,
    to_placements,
    to_string,
)

_PROPAGATOR = DTensor._op_dispatcher.sharding_propagator


def tensor_meta(value: torch.Tensor) -> TensorMeta:
    # TensorMeta says torch.Size; DTensor reads any tuple, and a plain one keeps reprs as they were
    return TensorMeta(tuple(value.shape), tuple(value.stride()), value.dtype)  # type: ignore[arg-type]


def has_rule(op) -> bool:
    return (
        op in _PROPAGATOR.op_single_dim_strategy_funcs
        or op in _PROPAGATOR.op_strategy_funcs
    )


def enumerate_strategies(op, args, kwargs, out_value, mesh: DeviceMesh) -> list[Strategy] | None:
    """All even strategies of ``op`` on ``mesh``; ``args``/``kwargs`` hold FakeTensors for tensors.

    Returns None when DTensor has no rule for the op.
    """
    mesh_shape = tuple(mesh.shape)
    single_dim = _PROPAGATOR.op_single_dim_strategy_funcs.get(op)
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if single_dim is not None:
        raw = _from_single_dim_rule(op, args, kwargs, out_value, mesh, single_dim)
    elif op in _PROPAGATOR.op_strategy_funcs:
        raw = [s for op_spec in _from_strategy_func(op, args, kwargs, out_value, mesh)
               if (s := _to_strategy(op_spec, len(leaves))) is not None]
    else:
        return None
    raw = [s for s in raw if s is not None]
    raw += loss_parallel.split_strategies(op, args, raw)  # cross-entropy on logits split by class
    out_leaves = list(tree_flatten(out_value)[0]) if out_value is not None else []
    strategies: dict[Strategy, None] = {}
    for strategy in raw:
        if strategy is None:
            continue
        if not all(fits_evenly(s, tuple(t.shape), mesh_shape) for s, t in zip(strategy.inputs, leaves)):
            continue
        if not all(
            s is None or not isinstance(t, torch.Tensor) or fits_evenly(s, tuple(t.shape), mesh_shape)
            for s, t in zip(strategy.outputs, out_leaves)
        ):
            continue
        if _passes_partial_through(strategy, leaves, out_leaves):
            continue
        strategies[strategy] = None
    return list(strategies)


def _passes_partial_through(strategy: Strategy, inputs: list, outputs: list) -> bool:
    """True when a pending reduction (Partial input) is carried, unshrunk, to the output.

    Such a strategy never pays: reducing on the way in moves the same bytes (and a
    reduce-scatter there is as cheap as anywhere later), while the op itself runs on
    full-size local tensors either way. Only an op that makes the tensor smaller (a
    reduction such as the loss's sum) is worth feeding a Partial. Dropping these keeps
    the candidate count on N-D meshes in check: every elementwise op otherwise doubles
    its strategies per mesh axis with Partial variants.
    """
    out_numel = max((t.numel() for t in outputs if isinstance(t, torch.Tensor)), default=0)
    for spec, tensor in zip(strategy.inputs, inputs):
        if tensor.numel() > out_numel or tensor.numel() <= 1:
            continue  # a reduction, or a scalar (the loss): carrying Partial there is free
        for axis, placement in enumerate(spec):
            if is_partial(placement) and any(
                out is not None and is_partial(out[axis]) for out in strategy.outputs
            ):
                return True
    return False


_aten = torch.ops.aten
SHAPE_ONLY_OPS = frozenset(
    getattr(_aten, name).default
    for name in (
        "new_zeros", "new_ones", "new_empty", "new_full", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like",
    )
)
"""Ops that read their input for its shape and dtype only: their output carries no
gradient back to it (a dropout's mask, ``empty_like(x).bernoulli_(p)``), any layout of
theirs reads the input as it is, and DTensor makes the output as the input is laid out,
which the plan may not have (BART's and T5's shifted decoder ids: ``input_ids.new_zeros(...)``)."""


def is_pointwise(op) -> bool:
    """Whether DTensor lists ``op`` among its pointwise ops (one rule for all of them)."""
    return op in _pointwise_ops()


@functools.cache
def _pointwise_ops() -> frozenset:
    from torch.distributed.tensor._ops import _pointwise_ops as registered

    # Newer torch keeps the ops it registers with rules of their own for Partial inputs
    # (neg, mul, add, div, ...) out of ``pointwise_ops``: they are pointwise all the same.
    return frozenset(registered.pointwise_ops) | frozenset(getattr(registered, "_specially_registered_ops", ()))


def runtime_schema_info(op):
    """The op's schema info as DTensor's dispatcher looks it up: its strategy function's,
    else its single-axis rule's."""
    return _schema_info(op, False) or _schema_info(op, True)


def _schema_info(op, single_dim: bool):
    table = (
        _PROPAGATOR.op_to_schema_info_for_single_dim_strategy
        if single_dim
        else _PROPAGATOR.op_to_schema_info
    )
    return table.get(op)


def _wrap(args, kwargs, make_strategy):
    def convert(x):
        return make_strategy(x) if isinstance(x, torch.Tensor) else x

    new_args = tree_map(convert, args)
    new_kwargs = {k: tree_map(convert, v) for k, v in kwargs.items()}
    # DTensor wants tensor lists as TupleStrategy when every element is a tensor.
    new_args = tuple(
        TupleStrategy(tuple(a)) if isinstance(a, (list, tuple)) and a and all(isinstance(x, OpStrategy) for x in a) else a
        for a in new_args
    )
    return new_args, new_kwargs


def _from_single_dim_rule(op, args, kwargs, out_value, mesh, info) -> list[Strategy]:
    from torch.distributed.tensor._ops.single_dim_strategy import _PreparedSingleDimStrategy

    probe_placements = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)

    def probe(t: torch.Tensor) -> OpStrategy:
        placements = probe_placements if t.dim() > 0 else (Replicate(),) * mesh.ndim
        return OpStrategy([OpSpec(DTensorSpec(mesh, placements, tensor_meta(t)))])

    probe_args, probe_kwargs = _wrap(args, kwargs, probe)
    schema = OpSchema(op, probe_args, probe_kwargs, schema_info=_schema_info(op, True))
    out_meta = tree_map(lambda t: tensor_meta(t) if isinstance(t, torch.Tensor) else None, out_value)
    if isinstance(out_meta, list):
        out_meta = tuple(out_meta)
    prepared = _PreparedSingleDimStrategy(info, schema, out_meta)
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    inplace = is_inplace(op) and bool(leaves)
    return _expand_over_mesh(prepared.expanded_strategies, prepared.num_outputs, mesh.ndim, len(leaves), inplace)


def is_inplace(op) -> bool:
    """An in-place op (``div_``): DTensor runs it where its self is, and its result is self."""
    return op.name().split("::")[1].split(".")[0].endswith("_")


def _expand_over_mesh(single_axis_rules, num_outputs: int, ndim: int, num_inputs: int, inplace: bool) -> list[Strategy]:
    """Every combination of one single-axis rule per mesh axis, as specs.

    This is what DTensor's ``expand_to_full_mesh_op_strategy`` enumerates, in the same
    order, without what it adds for run-time dispatch and we never read: a DTensorSpec
    per operand and a redistribution cost per input for every combination (about 3/4 of
    the enumeration time on a 2-D mesh). A rule holding a placement outside our
    vocabulary (strided shards, masked or max/min partials) is dropped whole: every
    combination using it would be. Mixed Partial kinds cannot arise (only sum and avg
    remain, which DTensor lets mix). An in-place op keeps the combinations that take self
    as it is and give it back so (DTensor never moves an in-place op's self).
    """
    rules = []
    for rule in single_axis_rules:
        try:
            rules.append(tuple(None if p is None else to_string(p) for p in rule))
        except ValueError:
            continue
    found: list[Strategy] = []
    for combo in itertools.product(rules, repeat=ndim):
        specs: list[Spec | None] = []
        for column in zip(*combo):
            if None in column:
                if any(p is not None for p in column):
                    break  # a value present on one axis and absent on another: not a strategy
                specs.append(None)
            else:
                specs.append(column)
        else:
            outputs, inputs = tuple(specs[:num_outputs]), tuple(s for s in specs[num_outputs:] if s is not None)
            if num_outputs == 1 and outputs[0] is None:
                raise RuntimeError("output spec is None")
            if len(inputs) != num_inputs:
                continue
            if inplace and outputs and outputs[0] not in (None, inputs[0]):
                continue
            found.append(Strategy(outputs, inputs))
    return found


def _from_strategy_func(op, args, kwargs, out_value, mesh) -> list[OpSpec]:
    """Strategy functions are written for runtime, where each input has one placement.

    Many of them "follow" their first input (and pair other inputs with it by index), so
    we call the function once per candidate placement of the first tensor input, with
    every other tensor input replicated, and take the union.
    """
    mesh_shape = tuple(mesh.shape)
    replicate = (Replicate(),) * mesh.ndim
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if not tensors:
        return []
    first = tensors[0]
    candidates = candidate_specs(tuple(first.shape), mesh_shape, partial=first.is_floating_point())
    func = _PROPAGATOR.op_strategy_funcs[op]
    found: list[OpSpec] = []
    for spec in candidates:
        placements = to_placements(spec)
        seen_first: list[bool] = []

        def one_spec(t: torch.Tensor) -> OpStrategy:
            chosen = placements if (t is first and not seen_first) else replicate  # noqa: B023 - called in this iteration
            if t is first:
                seen_first.append(True)  # noqa: B023 - called in this iteration
            return OpStrategy([OpSpec(DTensorSpec(mesh, chosen, tensor_meta(t)))])

        wrapped_args, wrapped_kwargs = _wrap(args, kwargs, one_spec)
        schema = OpSchema(op, wrapped_args, wrapped_kwargs, schema_info=_schema_info(op, False))
        try:
            result = func(schema)
        except (AssertionError, NotImplementedError, RuntimeError, ValueError, IndexError):
            continue  # the rule rejects this input placement
        if isinstance(result, TupleStrategy):
            # Ops returning a list of tensors: the planner treats the list as one value.
            result = result.children[0]
        assert isinstance(result, OpStrategy), result
        found.extend(result.strategies)
    return found


def _to_strategy(op_spec: OpSpec, num_inputs: int) -> Strategy | None:
    out = op_spec.output_specs
    outs = out if isinstance(out, tuple) else (out,)
    try:
        outputs = tuple(None if s is None else spec_from_placements(s.placements) for s in outs)
        if op_spec.input_specs is None:
            inputs = tuple(outputs[0] for _ in range(num_inputs))
        else:
            inputs = tuple(spec_from_placements(s.placements) for s in op_spec.input_specs)
    except ValueError:
        return None  # strided shards, max/min partials: outside our vocabulary
    given = tuple(s for s in inputs if s is not None)
    if len(inputs) != num_inputs or len(given) != len(inputs):
        return None
    return Strategy(outputs, given)
