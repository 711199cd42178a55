"""A solved layout's price, split where a pipeline can cut it: before the stack, one block, after it.

The tied planning problem (``pipeline/problem.py``) prices the whole model from two traced
blocks (the second one weighted for every block after the first). Given a solution, every
traced decision's chosen cost goes to the part of the model it belongs to: ``pre`` (what
runs before the stack: the embedding), ``block`` (the stack, divided by its number of
blocks: one block), ``post`` (what follows it: final norm, head, loss). Within a part the
cost is sorted by how it grows with a pipeline's microbatches:

- ``per_token``: seconds and bytes that scale with the tokens of a microbatch: the ops'
  kernel work, moves of activations and their gradients, activations kept for the backward;
- ``per_microbatch``: seconds each microbatch pays whatever its size: fixed kernel-launch
  and host-dispatch costs, work on a weight's values (its cast or transpose),
  a weight's move to its compute layout (an FSDP-style gather) in the forward;
- ``per_step``: what a step pays once however many microbatches it has: the optimizer, and
  the reductions of weight gradients (data parallel's all-reduce, FSDP's reduce-scatter),
  which accumulate over the microbatches and are reduced after the last.

A weight's value (``batch_free``) is a parameter or what is computed from parameters with no
batch input among its ancestors; a mask or table made of buffers and constants alone is
priced per token, as its size follows the batch or the sequence. Forward and backward shares of an op's time come from the
cost stage's rerun row (a checkpoint's rerun is the op's forward); a reduction of a gradient
is backward, a move's forward part is ``EdgeCost.rerun_seconds`` where the cost stage
keeps it (moves into the stack's blocks), else half the move when the value carries a
gradient (the gradient goes back the way the value came, in as many bytes: an FSDP
gather's reduce-scatter), the whole move when not (``forward_seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from autoplan.choices.graph import INPUT, PARAMETER
from autoplan.cost.comm import collective_seconds
from autoplan.cost.estimate import COMPUTE_PARTS, compute_part_rows, recompute_rows, splits_work
from autoplan.cost.values import output_values, tensor_bytes
from autoplan.placements import shard_factor
from autoplan.recompute_policy import selective_keeps
from autoplan.solve.tie import block_regions

PARTS = ("pre", "block", "post")
FIXED_PARTS = (COMPUTE_PARTS.index("launch_s"), COMPUTE_PARTS.index("dispatch_s"))
OPTIMIZER_PART = COMPUTE_PARTS.index("optimizer_s")


@dataclass
class PartCost:
    """One part's costs per device (see the module's docstring for the three kinds)."""

    forward_per_token: float = 0.0
    backward_per_token: float = 0.0
    forward_per_microbatch: float = 0.0
    backward_per_microbatch: float = 0.0
    per_step: float = 0.0
    state_bytes: float = 0.0
    """Parameters, their gradients and AdamW's two moments, as the layout stores them."""
    activation_bytes: float = 0.0
    """Kept for the backward (the batch included), at the traced batch."""
    full_rerun: float = 0.0
    """A checkpointed block's rerun (its ops' forward, the moves of what they read), per token."""
    full_freed: float = 0.0
    """What checkpointing a block frees (saved outputs, moved copies kept), less its input, which it keeps."""
    selective_rerun: float = 0.0
    selective_freed: float = 0.0
    full_rerun_per_microbatch: float = 0.0
    """The rerun's share that each microbatch pays whatever its size (a weight gathered again)."""
    selective_rerun_per_microbatch: float = 0.0

    def scaled(self, factor: float) -> PartCost:
        return PartCost(**{f.name: getattr(self, f.name) * factor for f in fields(self)})


@dataclass
class LayoutParts:
    """One layout's costs split into parts, at the batch it was traced with."""

    pre: PartCost = field(default_factory=PartCost)
    block: PartCost = field(default_factory=PartCost)
    """One block: the stack's costs over its number of blocks."""
    post: PartCost = field(default_factory=PartCost)
    blocks: int = 1
    boundary_bytes: float = 0.0
    """Per device: what one block hands the next (the values read across a block boundary),
    at the traced batch: what a stage sends its successor per microbatch, and gets back as
    a gradient."""
    traced_sequences: int = 1
    """The batch's dim 0 at which the per-token figures were taken."""


def layout_parts(problem, solution, sequences: int) -> LayoutParts:
    """``solution`` (of ``problem``, a tied ``pipeline/problem.Problem`` traced with a batch of
    ``sequences`` along dim 0) split into parts."""
    blocks = problem.blocks
    choices, costed = problem.choices, problem.costed
    graph = choices.graph
    mesh_shape = choices.mesh_shape
    choice = problem.expand(solution.choice)
    regions = block_regions(choices, blocks)
    order = [d.name for d in graph.decisions()]
    part = _part_of(problem)
    free = batch_free(graph)
    totals = {p: PartCost() for p in PARTS}
    for name in order:
        decision = graph.decision(name)
        c = choice[name]
        cost = costed.nodes[name]
        out = totals[part(name)]
        if decision.kind == PARAMETER:
            out.per_step += cost.compute_s[c]  # the optimizer
            out.state_bytes += (cost.end_bytes or cost.memory_bytes)[c]
            continue
        if cost.memory_kind != "model_state":
            out.activation_bytes += cost.memory_bytes[c]
        rows = compute_part_rows(cost)
        optimizer = rows[OPTIMIZER_PART][c]
        out.per_step += optimizer
        run = cost.compute_s[c] - optimizer
        fixed = sum(rows[i][c] for i in FIXED_PARTS)
        forward = recompute_rows(cost)[0][c]
        share = min(1.0, forward / run) if run > 0 else 0.0
        if free[name]:
            out.forward_per_microbatch += run * share
            out.backward_per_microbatch += run * (1 - share)
        else:
            out.forward_per_microbatch += fixed * share
            out.backward_per_microbatch += fixed * (1 - share)
            out.forward_per_token += (run - fixed) * share
            out.backward_per_token += (run - fixed) * (1 - share)
        weights = _weight_reductions(choices, decision, c, free, mesh_shape, costed.profile)
        weights = min(weights * _weight(problem, regions, name), cost.comm_s[c])
        out.per_step += weights
        out.backward_per_token += cost.comm_s[c] - weights
        if regions[name] is not None:
            rerun = recompute_rows(cost)
            out.full_rerun += rerun[0][c]
            out.full_freed += rerun[1][c]
            out.selective_rerun += rerun[2][c]
            out.selective_freed += rerun[3][c]
    boundary: dict[tuple[str, int], float] = {}
    keeps = selective_keeps()
    for (u, v, k), edge in costed.edges.items():
        row, col = edge.row_of[choice[u]], edge.col_of[choice[v]]
        seconds = edge.seconds[row][col]
        forward = forward_seconds(edge, row, col, graph.decision(u).requires_grad)
        out = totals[part(v)]
        kept = edge.kept_bytes[row][col] if edge.kept_bytes else 0.0
        if free[u]:
            out.forward_per_microbatch += forward
            out.per_step += seconds - forward  # a weight's gradient, moved back to its storage once
        else:
            out.forward_per_token += forward
            out.backward_per_token += seconds - forward
            out.activation_bytes += kept
        if regions[v] is not None:  # a checkpointed block frees the copies its ops keep, and moves them again
            moved_again = edge.rerun_seconds[row][col] if edge.rerun_seconds else 0.0
            out.full_freed += kept
            out.selective_freed += kept
            again = "_per_microbatch" if free[u] else ""
            setattr(out, f"full_rerun{again}", getattr(out, f"full_rerun{again}") + moved_again)
            if graph.decision(v).fx_node.target not in keeps:
                setattr(out, f"selective_rerun{again}", getattr(out, f"selective_rerun{again}") + moved_again)
        if regions[u] == 0 and regions[v] == 1:
            index = graph.out_index(u, v, k)
            values = output_values(graph.decision(u))
            spec = graph.decision(u).strategies[choice[u]].outputs[index] if index < len(values) else None
            if spec and not free[u]:
                boundary[(u, index)] = tensor_bytes(values[index]) / shard_factor(spec, mesh_shape)
    count = blocks.count
    block = totals["block"].scaled(1.0 / count)
    crossing = sum(boundary.values())
    block.full_freed -= crossing  # a checkpointed block keeps its input
    block.selective_freed -= crossing
    return LayoutParts(totals["pre"], block, totals["post"], count, crossing, sequences)


def forward_seconds(edge, row: int, col: int, carries_gradient: bool) -> float:
    """The forward part of a move's ``seconds`` (see the module's docstring)."""
    seconds = edge.seconds[row][col]
    if edge.rerun_seconds:
        return min(edge.rerun_seconds[row][col], seconds)
    return seconds / 2 if carries_gradient else seconds


def named_parts(problem) -> dict[str, str]:
    """Parameter and buffer FQNs outside the stack -> "pre" or "post": where a pipeline puts
    them (by their first reader: a weight the embedding reads and the head reads again, tied,
    is "pre")."""
    part = _part_of(problem)
    traced = problem.traced
    named: dict[str, str] = {}
    for node, fqns in traced.parameters.items():
        if node in problem.choices.graph:
            named.update({fqn: part(node) for fqn in fqns})
    for node, fqn in traced.buffers.items():
        if node in problem.choices.graph:
            named[fqn] = part(node)
    return {fqn: where for fqn, where in named.items() if where != "block"}


def _part_of(problem):
    """decision -> "pre", "block" or "post": the stack's decisions, then by graph order
    (a placeholder by its first reader)."""
    choices = problem.choices
    graph = choices.graph
    regions = block_regions(choices, problem.blocks)
    order = [d.name for d in graph.decisions()]
    position = {name: i for i, name in enumerate(order)}
    in_stack = [position[n] for n in order if regions[n] is not None and graph.decision(n).fx_node.op != "placeholder"]
    first, last = min(in_stack), max(in_stack)

    def part(name: str) -> str:
        if regions[name] is not None:
            return "block"
        readers = [position[v] for v in graph.successors(name)]
        at = min(readers) if graph.decision(name).fx_node.op == "placeholder" and readers else position[name]
        return "pre" if at < first else "post" if at > last else "block"

    return part


def _weight(problem, regions, name: str) -> float:
    """How many blocks a traced decision stands for (``solve/tie.py``'s weights)."""
    return problem.blocks.count - 1 if regions[name] == 1 else 1


def batch_free(graph) -> dict[str, bool]:
    """Per decision: whether it is a weight's (a parameter, or computed from parameters, and
    buffers or constants, with no batch input reaching it: a weight's cast, transpose or
    gather). Values made of buffers and constants alone (a causal mask, a rotary table) are
    not: their size follows the batch or the sequence, as the activations' does."""
    weight: dict[str, bool] = {}
    reached: dict[str, bool] = {}  # a batch input reaches it
    for decision in graph.decisions():
        name = decision.name
        preds = list(graph.predecessors(name))
        reached[name] = decision.kind == INPUT or any(reached[u] for u in preds)
        weight[name] = not reached[name] and (decision.kind == PARAMETER or any(weight[u] for u in preds))
    return weight


def _weight_reductions(choices, decision, c: int, free, mesh_shape, profile) -> float:
    """The seconds of the gradient reductions of weights (batch-free values needing a
    gradient) among ``decision``'s inputs, at one reduction per reader: what the cost stage
    charges it for them (``cost/estimate.py``), one traced block's worth."""
    graph = choices.graph
    strategy = decision.strategies[c]
    seconds = 0.0
    for (u, index, _), spec in zip(graph.inputs_of(decision.name), strategy.inputs):
        producer = graph.decision(u)
        if not (free[u] and producer.requires_grad):
            continue
        readers = max(1, sum(1 for _ in graph.successors(u)))
        values = output_values(producer)
        nbytes = tensor_bytes(values[index]) if index < len(values) else 0.0
        for axis, size in enumerate(mesh_shape):
            if spec[axis] == "R" and size > 1 and splits_work(strategy, axis):
                seconds += collective_seconds(profile, "all_reduce", nbytes / shard_factor(spec, mesh_shape),
                                              mesh_shape, axis) / readers
    return seconds

