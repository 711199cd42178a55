"""The collectives one training step of a solved plan runs.

One entry per collective: the module whose op causes it, its kind, mesh axis and bytes
(nccl-tests sizes, as in ``comm.py``), in the way ``apply_plan`` and DTensor run them:

- each edge whose producer's output spec differs from the spec its consumer asks for:
  ``comm.redistribute_collectives``, charged to the consumer's module. When the value
  carries a gradient, the gradient goes back the same way (``gradient_collectives``),
  starting from the reader's gradient layout: partial on each axis over which the reader
  splits its work while reading the value replicated. So a partial gradient of a
  redistributed value is reduced on that way back, in DTensor's order of axes (an FSDP
  parameter's gradient is reduce-scattered there);
- a partial gradient of a value read as it was made: autograd sums the readers' partial
  gradients, and one reduction per value and axis brings the sum to the value's layout
  where it was made (``apply_plan`` hooks module outputs and parameters to do so): a
  reduce_scatter where the value is sharded on that axis, else an all_reduce. Charged to
  the module that made the value; for a parameter, to its own module;
- the loss (``loss_reductions.py``): a loss left partial on an axis is all-reduced there
  (at the root), and so is a mean ``nll_loss``'s count of targets, in its backward.

The cost stage prices the same collectives, except that it charges each reader a share
of a shared gradient reduction, ignores the order of axes on a gradient's way back, and
leaves out the loss's all_reduces (``loss_reductions.py`` says why).

For a tied plan (``tie.py``) the table covers the traced layers; ``repeats.expand_plan``
copies the last one's entries to every later layer.
"""

from __future__ import annotations

from collections import Counter

from autoplan.choices import PARAMETER
from autoplan.comm import gradient_collectives, redistribute_collectives
from autoplan.cost import CostedGraph, gradient_roots, output_values, splits_work, tensor_bytes
from autoplan.loss_reductions import loss_output, loss_reductions
from autoplan.plan import ROOT_MODULE as ROOT, collective_table
from autoplan.placements import PARTIAL, REPLICATE, is_partial, is_shard, shard_factor


def step_collectives(costed: CostedGraph, choice: dict[str, int]) -> Counter:
    """``(module, kind, axis index, bytes) -> count`` for one step of the assignment ``choice``."""
    choices = costed.choices
    graph = choices.graph
    mesh_shape = choices.mesh_shape
    owners = choices.traced.node_modules
    found: Counter = Counter()

    def module_of(name: str) -> str:
        return owners.get(name) or ROOT

    roots = gradient_roots(choices)
    partial: dict[tuple[str, int], float] = {}
    for u, v, k, data in graph.edges(keys=True, data=True):
        producer, consumer = graph.nodes[u], graph.nodes[v]
        out_index = data["out_index"]
        src = producer["strategies"][choice[u]].output(out_index)
        strategy = consumer["strategies"][choice[v]]
        dst = strategy.inputs[k]
        nbytes = tensor_bytes(output_values(producer)[out_index])
        for kind, axis, size, _ in redistribute_collectives(src, dst, nbytes, mesh_shape, backward=False):
            found[(module_of(v), kind, axis, round(size))] += 1
        if not (producer["requires_grad"] and consumer["requires_grad"]):
            continue
        # The reader's gradient is partial on each axis it splits its work over while
        # reading the value whole.
        grad = tuple(
            PARTIAL if p == REPLICATE and n > 1 and splits_work(strategy, axis) else p
            for axis, (p, n) in enumerate(zip(dst, mesh_shape))
        )
        if src != dst:  # redistributed on the way in: its backward brings the gradient back
            for kind, axis, size in gradient_collectives(grad, src, nbytes, mesh_shape):
                found[(module_of(v), kind, axis, round(size))] += 1
        else:  # read as made: partial gradients are summed over readers, reduced once
            for axis, p in enumerate(grad):
                if is_partial(p):
                    partial[(roots[u], axis)] = nbytes / shard_factor(dst, mesh_shape)
    for (source, axis), nbytes in partial.items():
        data = graph.nodes[source]
        made = data["strategies"][choice[source]].outputs[0] if data["strategies"] else None
        kind = "reduce_scatter" if made is not None and is_shard(made[axis]) else "all_reduce"
        module = _parameter_module(choices, source) if data["kind"] == PARAMETER else module_of(source)
        found[(module, kind, axis, round(nbytes))] += 1

    loss = loss_output(choices)
    if loss is not None:
        node = loss[0]
        data = graph.nodes[node]
        strategy = data["strategies"][choice[node]]
        values = output_values(data)
        for at_root, axis, index in loss_reductions(loss, data["fx_node"], strategy, mesh_shape):
            found[(ROOT if at_root else module_of(node), "all_reduce", axis, round(tensor_bytes(values[index])))] += 1
    return found


def module_table(found: Counter, axis_names: tuple[str, ...]) -> dict:
    """``step_collectives``' counter as the plan's table (``plan.collective_table``)."""
    return collective_table(((module, axis_names[axis], kind, nbytes), count) for (module, kind, axis, nbytes), count in found.items())


def _parameter_module(choices, node: str) -> str:
    fqns = choices.traced.parameters.get(node, ())
    return fqns[0].rpartition(".")[0] if fqns else ROOT
