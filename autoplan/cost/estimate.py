"""Stage 3: cost of every candidate strategy and every edge, for one training step.

Per decision and strategy (arrays indexed like the decision's strategies):
- ``compute_s``: forward + backward of the op on its local shard. The kernel's work is a
  roofline, ``max(flops / (peak[dtype] * eff(flops)), bytes / (hbm * eff(bytes)))``; the
  work is split over every mesh axis on which any operand is not replicated; backward work
  is one matmul per matrix operand needing a gradient for matmul-like ops, and twice the
  forward traffic for the rest. Every op, views included, also pays the profile's fixed
  eager-DTensor costs (``profile.DispatchCost``) of its op class (``cost/op_classes.py``): the
  forward figure, and the backward figure when it carries a gradient; ``op_seconds`` adds
  them to the work (CPU) or overlaps them with it (an asynchronous device). Trainable
  parameters add ``AdamW.step()``: ``optimizer_param_s + local bytes / optimizer_bytes_per_s``.
  Under ``torch.compile`` (``cost/regime.py``), an op inside a compiled graph pays the
  profile's ``CompiledCost`` instead of the eager fixed costs, an elementwise op only
  ``fused_traffic`` of its traffic, and the first op of each compiled graph that graph's call.
- ``comm_s``: gradient reductions the strategy causes: an input that is replicated on
  an axis over which the op splits its work gets a partial gradient there, reduced by
  one all_reduce per producer (shared between the consumers that cause it); and the
  collectives an op runs itself (cross-entropy on logits split by class,
  ``dtensor/loss_parallel.py``).
- ``memory_bytes``: what the strategy holds where the backward starts, the step's usual
  peak; ``end_bytes``: what it holds where the backward ends; ``forward_bytes``: what it
  holds where the forward's heaviest move runs (``cost/memory.py``).

Per edge: what moving the value between the two layouts costs, and keeps (``cost/edges.py``);
``forward_bytes``, what the move holds up to the forward's heaviest move, is added here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from autoplan.choices.decision import Decision
from autoplan.choices.expert_layouts import is_expert_region, region_costs
from autoplan.choices.graph import BUFFER, CONSTANT, INPUT, OP, PARAMETER, ChoiceGraph
from autoplan.cost.comm import collective_seconds
from autoplan.cost.edges import EdgeCost, edge_cost
from autoplan.cost.memory import (
    STATE_COPIES_END,
    STATE_COPIES_START,
    heaviest_move,
    is_weight,
    kept_reads,
    moving_bytes,
    saved_outputs,
    transient_node,
    transient_parts,
    weight_values,
)
from autoplan.cost.op_classes import op_class
from autoplan.cost.profile import FUSED_CLASSES, ClusterProfile
from autoplan.cost.regime import EAGER, Regime
from autoplan.cost.values import VIEW_OPS, is_view, output_values, tensor_bytes  # noqa: F401 (re-exported)
from autoplan.dtensor import context_attention
from autoplan.dtensor.fused_attention import FUSED_FORWARD
from autoplan.dtensor.loss_parallel import own_collectives
from autoplan.dtensor.strategies import Strategy
from autoplan.placements import REPLICATE, Spec, shard_dim, shard_factor
from autoplan.recompute_policy import selective_keeps

aten = torch.ops.aten
MATMUL_OPS = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.linear.default,
}


@dataclass(frozen=True, slots=True)
class NodeCost:
    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    memory_bytes: tuple[float, ...]
    """Held where the backward starts (``cost/memory.py``): the budget's main row."""
    memory_kind: str
    """What the memory is: "model_state" (parameters and optimizer state) or "activations"."""
    end_bytes: tuple[float, ...] = ()
    """Held where the backward ends and in ``AdamW.step()`` (gradients included); () is zeros."""
    recompute: tuple[tuple[float, ...], ...] = ()
    """What checkpointing the op's module would change, per strategy (``RECOMPUTE_ROWS``:
    forward seconds rerun and saved bytes freed, under "full" and under "selective"); ()
    is zeros (parameters, inputs)."""
    forward_bytes: tuple[float, ...] = ()
    """Held while the forward's heaviest move runs (``cost/memory.py``'s third peak); () is zeros."""
    compute_parts: tuple[tuple[float, ...], ...] = ()
    """``compute_s`` split by what it is (``COMPUTE_PARTS``), one row per part, per strategy;
    the rows add up to ``compute_s``. () is zeros (inputs, buffers)."""


COMPUTE_PARTS = ("arithmetic_s", "below_peak_s", "memory_bound_s", "launch_s", "dispatch_s", "optimizer_s")
"""The rows of ``NodeCost.compute_parts``, what one op's compute time is made of:
- ``arithmetic_s``: its FLOPs at the device's peak for the op's dtype, where the FLOPs, not
  the traffic, bound its kernel;
- ``below_peak_s``: what the profile's matmul efficiency (below 1, lower for small
  products) adds to that;
- ``memory_bound_s``: the kernel's traffic at the profile's memory bandwidth, where the
  traffic bounds it;
- ``launch_s``: the profile's fixed kernel overhead;
- ``dispatch_s``: the host's fixed eager-DTensor time (``DispatchCost``) beyond the
  kernel's: all of it where it does not overlap the device (CPU), the part the kernel
  does not hide where it does (a view, a short kernel);
- ``optimizer_s``: ``AdamW.step()`` on a trainable parameter's local shard."""


RECOMPUTE_ROWS = ("full_rerun_s", "full_freed_bytes", "selective_rerun_s", "selective_freed_bytes")
"""The rows of ``NodeCost.recompute``: "full" reruns every op's forward and frees every
saved output; "selective" (``recompute_policy.SELECTIVE_KEEPS``) reruns and frees only the ops
whose outputs it does not keep, and stores every output of those it keeps, where autograd
would not have saved it (negative freed bytes: a projection whose output only an add reads,
as attention's output projection and the MLP's down projection feed the residual)."""


def compute_part_rows(cost: NodeCost) -> tuple[tuple[float, ...], ...]:
    """``cost.compute_parts``, zeros where the node has none."""
    if cost.compute_parts:
        return cost.compute_parts
    zeros = (0.0,) * len(cost.compute_s)
    return tuple(zeros for _ in COMPUTE_PARTS)


def forward_row(cost: NodeCost) -> tuple[float, ...]:
    """``cost.forward_bytes``, zeros where the node has none."""
    return cost.forward_bytes or (0.0,) * len(cost.compute_s)


def recompute_rows(cost: NodeCost) -> tuple[tuple[float, ...], ...]:
    """``cost.recompute``, zeros where the node has none."""
    if cost.recompute:
        return cost.recompute
    zeros = (0.0,) * len(cost.compute_s)
    return tuple(zeros for _ in RECOMPUTE_ROWS)


@dataclass(frozen=True)
class CostedGraph:
    choices: ChoiceGraph
    profile: ClusterProfile
    nodes: dict[str, NodeCost]
    edges: dict[tuple[str, str, int], EdgeCost]
    regime: str = EAGER.name
    """The compile regime the step is priced for (``cost/regime.py``)."""


def estimate_costs(choices: ChoiceGraph, profile: ClusterProfile, reads=None, regime: Regime = EAGER) -> CostedGraph:
    """``reads(producer, consumer)``: how many times the full model makes that read (default 1;
    more where one traced layer stands for several, see ``solve/tie.py``). ``regime``: how
    the step runs, eagerly or under ``torch.compile`` (``cost/regime.py``)."""
    graph = choices.graph
    mesh_shape = choices.mesh_shape
    reducers = _gradient_reducers(choices, reads or (lambda producer, consumer: 1))
    saved = saved_outputs(choices)
    transient = transient_node(choices)
    heads = graph_heads(choices, regime)
    nodes = {}
    for decision in graph.decisions():
        nodes[decision.name] = _node_cost(choices, profile, decision, reducers, saved.get(decision.name, ()),
                                          decision.name == transient, regime, decision.name in heads)
    edges = {}
    moves: dict[tuple, float] = {}  # (src, dst, bytes, backward) -> seconds: layers repeat the same moves
    free_inputs: dict[tuple, tuple] = {}  # (consumer's strategy list, input) -> (_free_inputs, answers of _not_run)
    kept = kept_reads(choices)
    for u, v, k, out_index in graph.reads():
        edges[(u, v, k)] = edge_cost(choices, profile, u, v, k, out_index, mesh_shape, moves, free_inputs, (u, v, k) in kept)
    _add_forward_row(choices, nodes, edges, transient)
    return CostedGraph(choices, profile, nodes, edges, regime.name)


def graph_heads(choices: ChoiceGraph, regime: Regime) -> set[str]:
    """The first traced op of each compiled graph, in graph order: it is charged the graph's
    call (``CompiledCost.graph_call_s``). A tied layer's head stands for every layer it
    stands for (``solve/tie.py`` weights it), so each layer pays one call."""
    if not regime.compiles:
        return set()
    owners = choices.traced.node_modules
    heads: dict[int, str] = {}
    for decision in choices.graph.decisions():
        if decision.kind != OP:
            continue
        index = regime.graph_of(owners.get(decision.name))
        if index is not None and index not in heads:
            heads[index] = decision.name
    return set(heads.values())


def _add_forward_row(choices, nodes, edges, transient) -> None:
    """Fill in the third memory peak (``cost/memory.py``) of ``nodes`` and ``edges``: everything
    held where the forward's heaviest move runs (``heaviest_move``). The reader's own
    output comes after the move's gathered buffer is freed (the output head's logits
    after its weight is copied into place), and is left out."""
    graph = choices.graph
    order = {name: i for i, name in enumerate(graph.nodes)}
    weights = weight_values(graph)
    moving = {key: _moving_bytes(choices, key, edge) for key, edge in edges.items() if key[0] in weights}
    heaviest = heaviest_move(graph, nodes, moving)
    if heaviest is None:
        return
    for key, edge in edges.items():
        if key[1] == heaviest and key not in moving:
            moving[key] = _moving_bytes(choices, key, edge)
    at = order[heaviest]
    for name, cost in nodes.items():
        if order[name] > at:
            continue
        held = list(cost.memory_bytes)
        if name == transient:  # the backward's first gradients: not yet
            own = graph.decision(name)
            held = [b - transient_bytes(choices, own, strategy) for b, strategy in zip(held, own.strategies)]
        nodes[name] = replace(cost, forward_bytes=tuple(held))
    for key, edge in edges.items():
        v = key[1]
        grid = moving[key] if v == heaviest else edge.kept_bytes if order[v] < at else None
        if grid is not None and any(b for row in grid for b in row):
            edges[key] = replace(edge, forward_bytes=grid)


def _moving_bytes(choices, key, edge: EdgeCost) -> tuple[tuple[float, ...], ...]:
    """Per (row, column): the buffers of the move while its reader runs (``moving_bytes``)."""
    u, v, k = key
    value = output_values(choices.graph.decision(u))[choices.graph.out_index(u, v, k)]
    return tuple(tuple(moving_bytes(src, dst, value, choices.mesh_shape) for dst in edge.cols) for src in edge.rows)


def splits_work(strategy, axis: int) -> bool:
    """Whether the strategy divides its work over mesh ``axis`` (some operand is not replicated there)."""
    return any(s[axis] != "R" for s in strategy.inputs) or any(s and s[axis] != "R" for s in strategy.outputs)


def gradient_roots(choices: ChoiceGraph) -> dict[str, str]:
    """Per node: the value it is a view of (itself if it is not a view). Partial gradients
    of a value and of its views are summed before anything reduces them."""
    graph = choices.graph
    root: dict[str, str] = {}
    for decision in graph.decisions():
        name = decision.name
        preds = list(graph.predecessors(name))
        if decision.kind not in (PARAMETER, INPUT, BUFFER) and is_view(decision) and len(preds) == 1:
            root[name] = root.get(preds[0], preds[0])
        else:
            root[name] = name
    return root


def _gradient_reducers(choices: ChoiceGraph, reads) -> dict[str, int]:
    """Per producer: how many work ops consume its value (looked through views).

    Consumers that each leave a partial gradient on the same value share one reduction:
    autograd sums the partial gradients before anything reduces them. A consumer that
    stands for several repeated layers counts once per layer.
    """
    graph = choices.graph
    root = gradient_roots(choices)
    counts: dict[str, int] = {}
    for name in graph.nodes:
        if root[name] != name:
            continue
        for pred in set(graph.predecessors(name)):
            source = root[pred]
            counts[source] = counts.get(source, 0) + reads(source, name)
    return {name: max(1, counts.get(root[name], 1)) for name in graph.nodes}


def _work(profile: ClusterProfile, flops: float, nbytes: float, dtype: torch.dtype) -> float:
    """The kernel's own time beyond any fixed cost: the slower of its FLOPs and its traffic."""
    if flops == 0 and nbytes == 0:
        return 0.0
    peak = profile.flops_for(str(dtype).removeprefix("torch."))
    compute = flops / (peak * profile.matmul_efficiency.at(flops)) if flops else 0.0
    memory = nbytes / (profile.memory_bandwidth_bytes_per_s * profile.memory_efficiency.at(nbytes)) if nbytes else 0.0
    return max(compute, memory)


def _work_parts(profile: ClusterProfile, flops: float, nbytes: float, dtype: torch.dtype) -> tuple[float, float, float]:
    """``_work`` split into (FLOPs at peak, what the matmul efficiency adds, traffic): the
    first two where the FLOPs bound the kernel, the third where its traffic does."""
    if flops == 0 and nbytes == 0:
        return 0.0, 0.0, 0.0
    peak = profile.flops_for(str(dtype).removeprefix("torch."))
    compute = flops / (peak * profile.matmul_efficiency.at(flops)) if flops else 0.0
    memory = nbytes / (profile.memory_bandwidth_bytes_per_s * profile.memory_efficiency.at(nbytes)) if nbytes else 0.0
    if compute >= memory:
        return flops / peak, compute - flops / peak, 0.0
    return 0.0, 0.0, memory


def _op_parts(dispatch, kernel_overhead_s: float, parts: tuple[float, float, float], total_s: float):
    """One op's (or its backward's) ``total_s`` (``DispatchCost.op_seconds``) as ``COMPUTE_PARTS``
    less the optimizer's: the kernel's parts, and the host's fixed time beyond them (the
    kernel overhead is charged only where the host's time overlaps the device's)."""
    arithmetic, below_peak, memory = parts
    launch = kernel_overhead_s if dispatch.overlaps_device and arithmetic + below_peak + memory > 0 else 0.0
    # max: where the kernel's time is the op's, the two sums may differ in the last bit
    return arithmetic, below_peak, memory, launch, max(0.0, total_s - (launch + arithmetic + below_peak + memory))


def optimizer_seconds(profile: ClusterProfile, local_bytes: float) -> float:
    """``AdamW.step()``'s time on one parameter's local shard."""
    dispatch = profile.dispatch
    return dispatch.optimizer_param_s + local_bytes / dispatch.optimizer_bytes_per_s


def _flops(node) -> float:
    if node.target is FUSED_FORWARD:  # torch's counter has no formula for the CPU kernel
        query, key, value = (a.meta["val"] for a in node.args[:3])
        return float(sdpa_flop_count(query.shape, key.shape, value.shape))
    formula = flop_registry.get(node.target.overloadpacket) if hasattr(node.target, "overloadpacket") else None
    if formula is None:
        return 0.0
    args = [a.meta["val"] if hasattr(a, "meta") else a for a in node.args]
    kwargs = {k: (a.meta["val"] if hasattr(a, "meta") else a) for k, a in node.kwargs.items()}
    try:
        return float(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # noqa: BLE001 - a formula that cannot read these arguments counts no flops
        return 0.0


def transient_bytes(choices, decision: Decision, strategy) -> float:
    """What ``transient_parts`` holds for ``decision`` under ``strategy``, each value in the
    layout the op uses: the larger of the two parts. The gradients' part also holds the
    weights the op reads split, gathered whole again (``regathered_weights``)."""
    mesh_shape = choices.mesh_shape

    def local(value, side, index):
        spec = (strategy.outputs if side == "out" else strategy.inputs)[index]
        return tensor_bytes(value) / shard_factor(spec, mesh_shape) if spec else 0.0

    gradients, alive = transient_parts(choices, decision)
    held = sum(local(*item) for item in gradients) + regathered_weights(choices, decision, strategy)
    return max(held, sum(local(*item) for item in alive))


def regathered_weights(choices, decision: Decision, strategy) -> float:
    """The buffers of the weights ``decision`` reads split under ``strategy``, gathered
    whole while its backward runs (``moving_bytes``). The forward's split product needs no
    whole weight, but the backward's runs on the output's gradient as it arrives, and
    DTensor may gather the weight for it (Mixtral's experts, their gate-up weight split by
    columns on dp: the gradient comes back partial, and each layer's backward grouped
    product gathers the weight rather than reduce the gradient, a gathered buffer and its
    copy into place). Counted for the op ``transient_node`` picks, as a bound: what its
    backward may hold on top of the saved values and its gradients."""
    graph = choices.graph
    held = 0.0
    for u, index, k in graph.inputs_of(decision.name):
        read = strategy.inputs[k] if k < len(strategy.inputs) else None
        if not read or all(shard_dim(p) is None for p in read) or not is_weight(graph, u):
            continue
        value = output_values(graph.decision(u))[index]
        held += moving_bytes(read, tuple(REPLICATE for _ in read), value, choices.mesh_shape)
    return held


def _placed(strategy: Strategy) -> Spec:
    """The layout a placeholder's ``strategy`` gives its one tensor."""
    spec = strategy.outputs[0]
    assert spec is not None, strategy
    return spec


def _node_cost(choices, profile, decision: Decision, reducers, saved=(), transient: bool = False,
               regime: Regime = EAGER, graph_head: bool = False) -> NodeCost:
    """``saved``: the output indices autograd keeps; ``transient``: the op whose backward
    gradients are counted at the backward's start (``cost/memory.py``); ``regime``: whether
    the op runs inside a compiled graph; ``graph_head``: it pays its graph's call."""
    mesh_shape = choices.mesh_shape
    strategies = decision.strategies
    kind = decision.kind
    outputs = output_values(decision)
    if kind in (PARAMETER, INPUT, BUFFER):
        value = outputs[0]
        full = tensor_bytes(value)
        local = [full / shard_factor(_placed(s), mesh_shape) for s in strategies]
        if kind == PARAMETER and decision.requires_grad:
            opt = [optimizer_seconds(profile, b) for b in local]
            zeros = (0.0,) * len(local)
            return NodeCost(tuple(opt), zeros, tuple(STATE_COPIES_START * b for b in local), "model_state",
                            tuple(STATE_COPIES_END * b for b in local),
                            compute_parts=(*(zeros for _ in COMPUTE_PARTS[:-1]), tuple(opt)))
        return NodeCost((0.0,) * len(local), (0.0,) * len(local), tuple(local),
                        "model_state" if kind == PARAMETER else "activations", tuple(local))

    node = decision.fx_node
    graph = choices.graph
    ins = graph.inputs_of(decision.name)
    in_values = [output_values(graph.decision(u))[i] if len(output_values(graph.decision(u))) > i else None for u, i, _ in ins]
    in_bytes = [tensor_bytes(v) for v in in_values]
    out_bytes = [tensor_bytes(v) for v in outputs]
    view = is_view(decision)
    flops = 0.0 if view else choices.traced.opaque_flops.get(decision.name) or _flops(node)
    dtype = next((v.dtype for v in outputs if isinstance(v, torch.Tensor)), torch.float32)
    grad_inputs = [graph.decision(u).requires_grad for u, _, _ in ins]
    # matmul backward: one matmul per matrix operand needing a gradient (a bias is a reduction)
    grad_matrices = sum(g and getattr(v, "ndim", 0) >= 2 for g, v in zip(grad_inputs, in_values))
    dispatch = profile.dispatch
    kind_of_op = op_class(node.target)
    compiled = regime.compiled(choices.traced.node_modules.get(decision.name))
    traffic_share, graph_call, launch_s = 1.0, 0.0, profile.kernel_overhead_s
    if compiled:
        costs = dispatch.compiled_costs(profile.kernel_overhead_s)
        forward_fixed, backward_fixed = costs.fixed_seconds(kind_of_op)
        if kind_of_op in FUSED_CLASSES:  # a run of fused ops shares one kernel: its launch and its traffic
            traffic_share = costs.fused_traffic
            launch_s *= costs.fused_traffic
        if graph_head:  # the graph's call, forward and backward, charged once with its first op
            graph_call = costs.graph_call_s
    else:
        forward_fixed, backward_fixed = dispatch.fixed_seconds(kind_of_op)
    # A tensor factory (no tensor input) runs as a plain op: DTensor only sees its result later.
    if kind == CONSTANT and not compiled:
        forward_fixed = profile.kernel_overhead_s
    compute, comm, memory, rerun, freed, stored, parts = [], [], [], [], [], [], []
    kept_by_selective = node.target in selective_keeps()
    region = is_expert_region(node, choices.traced.opaque_reasons)
    for strategy in strategies:
        inner = region_costs(node, strategy, mesh_shape, decision.requires_grad) if region else None
        split = 1
        for axis, size in enumerate(mesh_shape):
            if splits_work(strategy, axis):
                split *= size
        local_in = sum(b / shard_factor(s, mesh_shape) for b, s in zip(in_bytes, strategy.inputs))
        local_out = sum(b / shard_factor(s, mesh_shape) for b, s in zip(out_bytes, strategy.outputs) if s)
        # A view moves no data, but it is a DTensor op all the same: it pays the fixed costs.
        traffic = traffic_share * (local_in + local_out + (inner.traffic_bytes if inner else 0.0))
        work = 0.0 if view else _work(profile, flops / split, traffic, dtype)
        work_parts = (0.0, 0.0, 0.0) if view else _work_parts(profile, flops / split, traffic, dtype)
        forward = dispatch.op_seconds(forward_fixed, launch_s, work)
        op_parts = _op_parts(dispatch, launch_s, work_parts, forward)
        backward = 0.0
        if decision.requires_grad:
            factor = max(1, grad_matrices) if node.target in MATMUL_OPS else 2
            backward = dispatch.op_seconds(backward_fixed, factor * launch_s, factor * work)
            scaled = (factor * work_parts[0], factor * work_parts[1], factor * work_parts[2])
            back_parts = _op_parts(dispatch, factor * launch_s, scaled, backward)
            op_parts = tuple(a + b for a, b in zip(op_parts, back_parts))
        # The graph's call is the host's alone (a device waits through it): on top of the op's time,
        # and not repeated by a checkpoint's rerun, which runs inside the compiled backward.
        compute.append(forward + backward + graph_call)
        parts.append((*op_parts[:-1], op_parts[-1] + graph_call, 0.0))
        rerun.append(forward)
        reduce = 0.0
        for (u, _, _), spec, needs, nbytes in zip(ins, strategy.inputs, grad_inputs, in_bytes):
            if not needs:
                continue
            for axis, size in enumerate(mesh_shape):
                if spec[axis] != "R" or size == 1:
                    continue
                if splits_work(strategy, axis):
                    local_bytes = nbytes / shard_factor(spec, mesh_shape)
                    reduce += collective_seconds(profile, "all_reduce", local_bytes, mesh_shape, axis) / reducers[u]
        for kind, axis, nbytes, _ in own_collectives(node, outputs, strategy, mesh_shape, decision.requires_grad):
            reduce += collective_seconds(profile, kind, nbytes, mesh_shape, axis)
        gathers, gathered_kept = context_attention.kv_gathers(node, in_values, strategy, mesh_shape, decision.requires_grad)
        for kind, axis, nbytes, _ in gathers + list(inner.collectives if inner else ()):
            reduce += collective_seconds(profile, kind, nbytes, mesh_shape, axis)
        comm.append(reduce)
        if inner is not None:  # kept inside the region, which the trace does not see
            gathered_kept += inner.held_bytes
        held = sum(out_bytes[i] / shard_factor(strategy.outputs[i], mesh_shape)
                   for i in saved if i < len(out_bytes) and strategy.outputs[i]) + gathered_kept
        freed.append(held)
        if kept_by_selective:  # selective checkpointing stores every output of the op, saved by autograd or not
            stored.append(-sum(b / shard_factor(s, mesh_shape) for i, (b, s) in enumerate(zip(out_bytes, strategy.outputs))
                               if s and i not in saved))
        if transient:
            held += transient_bytes(choices, decision, strategy)
        memory.append(held)
    zeros = (0.0,) * len(strategies)
    recompute = (tuple(rerun), tuple(freed)) + ((zeros, tuple(stored)) if kept_by_selective else (tuple(rerun), tuple(freed)))
    return NodeCost(tuple(compute), tuple(comm), tuple(memory), "activations", (), recompute,
                    compute_parts=tuple(zip(*parts)) if parts else ())
