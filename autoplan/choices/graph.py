"""Stage 2: the placement-choice graph.

One decision per graph value that can be laid out: every parameter, batch input and
op node. Its candidates come from DTensor's registry (``dtensor/strategies.py``); an op the
registry does not cover runs replicated and is reported. Nodes computed from no
placeholder at all (masks and position ids built from ``arange``) are replicated
without a decision: every rank computes them alike, which is what DTensor's implicit
replication does at run time.

Edges run producer -> consumer, keyed by the consumer's tensor-input index, and carry
which output of the producer they read (multi-output ops are read through getitem).
Each node holds a ``Decision`` (``choices/decision.py``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TypeGuard

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.choices.decision import Decision, DecisionGraph
from autoplan.choices.expert_layouts import expert_strategies, is_expert_region
from autoplan.dtensor import strategies as registry
from autoplan.dtensor.overrides import while_installed
from autoplan.dtensor.planning_mesh import planning_mesh
from autoplan.dtensor.rules import backward_op
from autoplan.dtensor.strategies import Strategy
from autoplan.placements import candidate_specs, replicated
from autoplan.trace.backward_run import backward_run
from autoplan.trace.opaque import DATA_DEPENDENT, EXPERTS, OPAQUE_OP
from autoplan.trace.tracer import TracedGraph

PARAMETER, BUFFER, INPUT, OP, CONSTANT, FALLBACK = (
    "parameter", "buffer", "input", "op", "constant", "fallback",
)


@dataclass(frozen=True)
class ChoiceGraph:
    """Decisions and their candidate strategies (``graph``: one ``Decision`` per node)."""

    graph: DecisionGraph
    traced: TracedGraph
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    warnings: tuple[str, ...]
    fallback_ops: tuple[str, ...] = ()
    """Ops with no DTensor rule, planned replicated (sorted names such as ``aten.renorm.default``)."""

    def decision(self, name: str) -> Decision:
        return self.graph.decision(name)

    def strategies(self, name: str) -> tuple[Strategy, ...]:
        return self.graph.decision(name).strategies


@while_installed  # DTensor's registry, with autoplan's rules and views in it
def build_choices(traced: TracedGraph, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> ChoiceGraph:
    mesh = planning_mesh(mesh_shape, axis_names)
    graph = DecisionGraph()
    tuple_items: dict[str, tuple[str, int]] = {}  # getitem node -> (producer, index)
    from_placeholder: set[str] = set()
    requires_grad: set[str] = set()
    # A write in place hands its value's gradient need to the tensor written into: once
    # ``out[:, t] = x`` ran, every later read of ``out`` (or of a view of it) needs one,
    # as autograd rebases ``out`` on the write (Olmo-Hybrid's chunked delta rule fills a
    # zero tensor so, and its output norm's backward runs on what was read from it).
    bases: dict[str, str] = {}  # a view (or an item of one) -> the tensor it views
    written: set[str] = set()  # tensors a value that needs a gradient was written into
    cache: dict[tuple, tuple[Strategy, ...] | frozenset[str] | None] = {}  # per op signature
    uncovered: dict[str, list[str]] = {}
    without_backward: set[str] = set()  # ops with a rule whose backward op has none
    # Ops without a rule that run replicated without a warning: the backward kernels of
    # uncovered ops, and ops on values the model builds itself (replicated on every rank,
    # but one of them can reach DTensor at run time through a module boundary, TAPAS's
    # segment reductions of its token type ids).
    silent_fallbacks: set[str] = set()
    module_of = traced.node_modules

    for node in traced.graph_module.graph.nodes:
        if node.op == "placeholder":
            kind = PARAMETER if node.name in traced.parameters else BUFFER if node.name in traced.buffers else INPUT
            value = node.meta["val"]
            if kind == BUFFER:
                specs = [replicated(len(mesh_shape))]
            else:  # a parameter may be stored with a dim split over several axes (FSDP over TP)
                specs = candidate_specs(tuple(value.shape), mesh_shape, partial=False, several_axes=kind == PARAMETER)
            graph.add_decision(Decision(
                node.name, kind, node, module_of[node.name],
                strategies=tuple(Strategy((spec,), ()) for spec in specs),
                requires_grad=node.name in traced.trainable,
            ))
            from_placeholder.add(node.name)
            if node.name in traced.trainable:
                requires_grad.add(node.name)
            continue
        if node.op == "get_attr":
            # A tensor the forward built from Python data (``torch.tensor(...)``: ALiBi
            # slopes, a cache's empty start): the same on every rank, like an arange.
            graph.add_decision(Decision(
                node.name, CONSTANT, node, module_of[node.name],
                strategies=(_replicate_all(node, 0, len(mesh_shape)),), requires_grad=False,
            ))
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            source, index = node.args
            tuple_items[node.name] = (source.name, index)
            if source.name in from_placeholder:
                from_placeholder.add(node.name)
            if source.name in requires_grad:
                requires_grad.add(node.name)
            if source.name in bases:
                bases[node.name] = bases[source.name]
            continue

        tensor_inputs = [a for a in tree_flatten((node.args, node.kwargs))[0] if is_tensor_input(a)]
        sources = [tuple_items.get(a.name, (a.name, 0)) for a in tensor_inputs]
        depends = any(a.name in from_placeholder for a in tensor_inputs)
        # An op that reads its input for the shape only (a dropout mask's empty_like) hands no gradient back.
        # A tensor the forward made a leaf that needs one gets one (``trace/grad_leaves.py``);
        # an op run without autograd makes none (``trace/no_grad.py``).
        grad = depends and _floating(node) and node.name not in traced.no_grad and (
            node.name in traced.grad_leaves
            or (node.target not in registry.SHAPE_ONLY_OPS
                and any(a.name in requires_grad or bases.get(a.name, a.name) in written for a in tensor_inputs)))
        if depends:
            from_placeholder.add(node.name)
        if grad:
            requires_grad.add(node.name)
        target = written_in_place(node)
        if target is not None:  # an in-place op returns the tensor it wrote into
            bases[node.name] = bases.get(target.name, target.name)
            if grad:
                written.add(bases[node.name])
        elif isinstance(node.target, torch._ops.OpOverload) and node.target.is_view and tensor_inputs:
            bases[node.name] = bases.get(tensor_inputs[0].name, tensor_inputs[0].name)

        kind, options = OP, None
        if is_expert_region(node, traced.opaque_reasons):
            options = expert_strategies(node, tuple(mesh_shape))  # split over an axis, or whole
        elif node.target is OPAQUE_OP:
            kind = FALLBACK  # replicated: the planner cannot see inside (see opaque.py)
        elif depends:
            options = _strategies_for(node, mesh, cache)
            if options and grad and backward_without_rule(node.target):
                options = None  # replicated, so that its backward's fallback gathers nothing
                without_backward.add(str(node.target))
            buffer_inputs = [i for i, (source, _) in enumerate(sources) if source in traced.buffers]
            if options and buffer_inputs:
                options = _keep_buffers_in_place(options, buffer_inputs) or None
            if not options:
                kind = FALLBACK
                uncovered.setdefault(str(node.target), []).append(node.name)
                if grad:
                    silent_fallbacks |= _backward_ops_without_rule(node, cache)
        else:
            kind = CONSTANT
            if tensor_inputs and isinstance(node.target, torch._ops.OpOverload) and _needs_fallback(node.target):
                silent_fallbacks.add(str(node.target))
        if not options:
            options = (_replicate_all(node, len(tensor_inputs), len(mesh_shape)),)
        graph.add_decision(Decision(node.name, kind, node, module_of[node.name], options, requires_grad=grad))
        for index, (source, out_index) in enumerate(sources):
            graph.add_read(source, node.name, index, out_index)

    warnings = traced.warnings + tuple(
        f"no DTensor sharding rule for {op}{' backward' if op in without_backward else ''} ({len(names)} node(s), "
        f"e.g. {names[0]}): replicated"
        for op, names in sorted(uncovered.items())
    ) + tuple(
        f"module {fqn} ({cls}) {reason}: run replicated as one opaque region, not searched"
        + ("; its compute cost is an upper bound" if reason == DATA_DEPENDENT else "")
        for fqn, cls in sorted(traced.opaque_modules.items())
        for reason in (traced.opaque_reasons.get(fqn, DATA_DEPENDENT),) if reason != EXPERTS
    )
    fallback_ops = tuple(sorted(set(uncovered) | silent_fallbacks))
    return ChoiceGraph(graph, traced, tuple(mesh_shape), tuple(axis_names), warnings, fallback_ops)


def _keep_buffers_in_place(options: tuple[Strategy, ...], buffer_inputs: list[int]) -> tuple[Strategy, ...]:
    """Strategies that read each buffer where it lives (buffers are replicated).

    Ops may update a buffer in place (BatchNorm's running statistics, even though
    ``native_batch_norm``'s schema does not declare it); fed a redistributed copy, the
    update would be lost. Buffers are small, so reading them replicated costs little.
    """
    return tuple(
        strategy for strategy in options
        if all(all(p == "R" for p in strategy.inputs[i]) for i in buffer_inputs)
    )


def is_tensor_input(arg) -> bool:
    """Whether an fx argument counts as one of an op's tensor inputs (a getitem of a tuple too)."""
    return (isinstance(arg, fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)) or (
        isinstance(arg, fx.Node) and arg.target is operator.getitem
    )


def written_in_place(node: fx.Node) -> fx.Node | None:
    """The tensor argument ``node``'s op writes into (its first, for ``copy_``, ``add_``
    and the like), or None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments or not node.args:
        return None
    alias = schema.arguments[0].alias_info
    first = node.args[0]
    return first if alias is not None and alias.is_write and isinstance(first, fx.Node) else None


def _floating(node: fx.Node) -> bool:
    values = [v for v in tree_flatten(node.meta.get("val"))[0] if isinstance(v, torch.Tensor)]
    return any(v.is_floating_point() or v.is_complex() for v in values)  # complex: rotary embeddings


def _replicate_all(node: fx.Node, num_inputs: int, ndim: int) -> Strategy:
    outputs = tuple(
        replicated(ndim) if isinstance(v, torch.Tensor) else None
        for v in tree_flatten(node.meta.get("val"))[0]
    ) or (replicated(ndim),)
    return Strategy(outputs, (replicated(ndim),) * num_inputs)


def _signature(node: fx.Node) -> tuple:
    def describe(arg):
        if isinstance(arg, fx.Node):
            val = arg.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", tuple(val.shape), tuple(val.stride()), val.dtype)
            return ("value", repr(val))
        return arg

    args = tree_map(describe, (node.args, node.kwargs))
    return (node.target, repr(args))


def backward_without_rule(op) -> bool:
    """Whether ``op`` has a backward op (``<name>_backward``: ``hardtanh_backward``,
    ``avg_pool2d_backward``) with no sharding rule, which DTensor could not run on what the
    forward's rule would hand it; ``dtensor/rules.fallback_rules`` gives it one that
    gathers everything, so the forward is planned replicated, and the gathers are none."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    backward = backward_op(op)
    if backward is None or "default" not in backward.overloads():
        return False
    # A composite backward (``embedding_backward``) reaches DTensor as the ops it is made of.
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(backward.default.name(), "CompositeImplicitAutograd")
    return not composite and not registry.has_rule(backward.default)


def _backward_ops_without_rule(node: fx.Node, cache: dict) -> frozenset[str]:
    """The kernels the backward of ``node``'s op runs, not named after it, that have no
    sharding rule: they run replicated, as the op itself does, and the plan names them in
    ``fallback_ops`` (``im2col``'s backward is ``col2im``; ``<op>_backward`` gets its
    fallback from ``rules.fallback_rules`` already). Views and in-place ops are left out:
    a fallback holds for every call of the op while the plan runs. Cached by op signature."""
    key = ("backward", _signature(node))
    if key not in cache:
        named = backward_op(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        ran = {read.op for read in backward_run(node) or ()}
        cache[key] = frozenset(str(op) for op in ran if _needs_fallback(op) and op.overloadpacket is not named)
    return cache[key]


def _needs_fallback(op) -> TypeGuard[torch._ops.OpOverload]:
    """An aten kernel, neither a view nor in place, that reaches DTensor as it is (not
    composite) and has no sharding rule."""
    return (
        isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and not op.is_view
        and not op._schema.is_mutable and not registry.has_rule(op)
        and not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    )


def _strategies_for(node: fx.Node, mesh: DeviceMesh, cache: dict) -> tuple[Strategy, ...] | None:
    """Strategies for one op node, cached by op signature (repeated layers hit the cache)."""
    key = _signature(node)
    if key in cache:
        return cache[key]
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not registry.has_rule(op):
        cache[key] = None
        return None
    args = tree_map(lambda a: a.meta["val"] if isinstance(a, fx.Node) else a, node.args)
    kwargs = tree_map(lambda a: a.meta["val"] if isinstance(a, fx.Node) else a, node.kwargs)
    try:
        found = registry.enumerate_strategies(op, args, kwargs, node.meta["val"], mesh)
    except Exception:  # noqa: BLE001 - a rule that cannot enumerate is treated like a missing rule
        found = None
    cache[key] = tuple(found) if found else None
    return cache[key]
