"""Experts split over a mesh axis, run as the plan says (``Plan.expert_parallel``).

Each experts module (``trace/experts.py`` says how they are recognised) holds its
``E/n`` experts as the local shard of its weights (``Shard(0)`` on the axis). At run time
its tokens are laid out split by row over the expert axis (and kept split wherever the
plan already splits them), taken as this rank's local rows, sorted by expert, sent to
the ranks that hold their experts and back (``token_exchange.py``), and handed on as a
DTensor in the same row split. The module's own forward computes on its local experts:
its weights are swapped for their local shards, and each integer attribute equal to
``E`` (its expert count, read by the implementations to size their groups) reads
``E/n`` while it runs.

The local shards' gradients are marked partial on every axis that splits the tokens
(each rank saw its own tokens) and split on the expert axis, so the parameter's gradient
hook sums them over the data axes, as data parallelism's gradients are.

- **routed** modules (tokens, top-k index, top-k weights) run on each received row alone
  with weight one; the rows come back and are weighted and summed per token here, as the
  module would (``sum_k w_k * expert_k(token)``), so the router's gradient flows as before.
- **grouped** modules (tokens sorted by expert, counts) are called by a parent that sorts
  and weights: the parent runs on this rank's local rows (its inputs taken local, its
  output made a DTensor again), and the experts module exchanges the sorted rows itself.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_flatten, tree_unflatten

from autoplan.apply.token_exchange import combine, dispatch
from autoplan.errors import PlanError
from autoplan.plan.expert_parallel import parent_of
from autoplan.plan.module_plan import Plan
from autoplan.trace.experts import GROUPED


def install_expert_parallel(modules: dict[str, nn.Module], plan: Plan, mesh: DeviceMesh, outside_plan) -> None:
    """Route every module of ``plan.expert_parallel`` (and a grouped one's parent) as above.

    ``outside_plan()`` is a context in which the plan's module hooks stand aside: the
    local experts compute on plain tensors, and a module they call (an activation module
    that transformers shares between every layer) must not lay those out as DTensors."""
    for fqn, layout in sorted(plan.expert_parallel.items()):
        axis = plan.axis_names.index(layout["axis"])
        experts = modules[fqn]
        tokens = _TokenLayout()
        experts.forward = _experts_forward(experts, experts.forward, int(layout["experts"]), axis, mesh,
                                           tokens, outside_plan, grouped=layout["call"] == GROUPED)
        if layout["call"] == GROUPED:
            parent = modules[parent_of(fqn)]
            own = [name for name, _ in parent.named_parameters() if not name.startswith(fqn.rpartition(".")[2] + ".")]
            if own:
                raise PlanError(f"expert parallel: {parent_of(fqn) or '<root>'}, which calls the grouped experts "
                                f"{fqn}, holds parameters of its own ({own[0]})", hint="plan it without expert parallel")
            parent.forward = _local_forward(parent.forward, axis, mesh, tokens, int(layout["experts"]))


class _TokenLayout:
    """The row placements of the tokens of the call in progress (set by the caller)."""

    placements: tuple = ()


def _row_placements(placements, axis: int) -> tuple:
    """Rows split wherever they are split already, and on the expert axis; replicated elsewhere."""
    return tuple(Shard(0) if (isinstance(p, Shard) and p.dim == 0) or a == axis else Replicate()
                 for a, p in enumerate(placements))


def _gradient_placements(rows, axis: int) -> tuple:
    """The local expert shards' gradients: split on the expert axis, summed over the
    axes that split the tokens, the same on the others."""
    return tuple(Shard(0) if a == axis else Partial() if isinstance(p, Shard) else Replicate()
                 for a, p in enumerate(rows))


@contextmanager
def _local_experts(module: nn.Module, experts: int, ranks: int, gradients: tuple):
    """``module`` computing on its local experts: its weights their local shards (their
    gradients in the ``gradients`` placements), and its integer attributes equal to its
    expert count that count divided by the axis size."""
    state = {}
    for name, param in module.named_parameters(recurse=False):
        state[name] = param.to_local(grad_placements=gradients) if isinstance(param, DTensor) else param
    counts = {name: value for name, value in vars(module).items() if type(value) is int and value == experts}
    try:
        for name in counts:
            setattr(module, name, experts // ranks)
        with _reparametrize_module(module, state):
            yield
    finally:
        for name, value in counts.items():
            setattr(module, name, value)


def _experts_forward(module: nn.Module, original, experts: int, axis: int, mesh: DeviceMesh,
                     tokens: _TokenLayout, outside_plan, grouped: bool):
    group = mesh.get_group(axis)
    ranks = mesh.size(axis)

    def routed(hidden, top_k_index, top_k_weights):
        if not isinstance(hidden, DTensor):
            return original(hidden, top_k_index, top_k_weights)
        rows = _row_placements(hidden.placements, axis)
        hidden_d, index_d, weights_d = (_as_dtensor(t, mesh).redistribute(mesh, rows)
                                        for t in (hidden, top_k_index, top_k_weights))
        local, index, weights = hidden_d.to_local(), index_d.to_local(), weights_d.to_local()
        count, top_k = index.shape
        flat = index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = flat.new_zeros(experts) if isinstance(flat, FakeTensor) else torch.bincount(flat, minlength=experts)
        received, exchange = dispatch(local[order // top_k], counts, group, experts)
        local_ids = torch.cat([torch.full((count,), j, dtype=torch.int64, device=flat.device)
                               for j, count in enumerate(exchange.local_counts)])
        ones = torch.ones((received.shape[0], 1), dtype=weights.dtype, device=weights.device)
        with _local_experts(module, experts, ranks, _gradient_placements(rows, axis)), outside_plan():
            computed = original(received, local_ids[:, None], ones)
        back = combine(computed, exchange)
        pairs = back.new_zeros(back.shape).index_copy(0, order, back)
        out = (pairs.view(count, top_k, -1) * weights.unsqueeze(-1)).sum(1).to(local.dtype)
        return DTensor.from_local(out, mesh, rows, run_check=False, shape=hidden.shape, stride=hidden.stride())

    def grouped_call(rows_sorted, counts):
        if not tokens.placements:  # not inside a planned parent's call: as written
            return original(rows_sorted, counts)
        received, exchange = dispatch(rows_sorted, counts, group, experts)
        with _local_experts(module, experts, ranks, _gradient_placements(tokens.placements, axis)), outside_plan():
            computed = original(received, torch.tensor(exchange.local_counts, dtype=counts.dtype, device=counts.device))
        return combine(computed, exchange)

    return grouped_call if grouped else routed


def _local_forward(original, axis: int, mesh: DeviceMesh, tokens: _TokenLayout, experts: int):
    """The grouped experts' parent, run on this rank's rows: its DTensor inputs with the
    token rows (inputs of the first one's rank and leading size) taken local, row-split, and each other
    input taken as this rank's part: a sum over the rows that is still partial where the
    rows are split, or, where it is whole, a count of routed tokens per expert (it equals
    the ``E``-bin count of an integer token input), counted again over this rank's rows."""

    def forward(*args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        first = next((x for x in leaves if isinstance(x, DTensor)), None)
        if first is None:
            return original(*args, **kwargs)
        rows = _row_placements(first.placements, axis)
        row_count = first.shape[0]
        is_rows = [isinstance(x, DTensor) and x.dim() == first.dim() and x.shape[0] == row_count for x in leaves]
        local_leaves = [x.redistribute(mesh, rows).to_local() if row else x for x, row in zip(leaves, is_rows)]
        ids = [(x, local) for x, local, row in zip(leaves, local_leaves, is_rows) if row and not x.is_floating_point()]
        local_leaves = [_other_part(x, rows, ids, experts, mesh) if isinstance(x, DTensor) and not row else local
                        for x, local, row in zip(leaves, local_leaves, is_rows)]
        local_args, local_kwargs = tree_unflatten(local_leaves, spec)
        outer, tokens.placements = tokens.placements, rows
        try:
            output = original(*local_args, **local_kwargs)
        finally:
            tokens.placements = outer
        out_leaves, out_spec = tree_flatten(output)
        return tree_unflatten([_rows_dtensor(x, mesh, rows, row_count) if isinstance(x, torch.Tensor) else x
                               for x in out_leaves], out_spec)

    return forward


def _other_part(value: DTensor, rows: tuple, ids: list, experts: int, mesh: DeviceMesh) -> torch.Tensor:
    if isinstance(value.to_local(), FakeTensor):
        return value.to_local()  # a dry run: the experts take the load as even (``token_exchange.dispatch``)
    if all(p.is_partial() for p, row in zip(value.placements, rows) if isinstance(row, Shard)):
        return value.to_local()
    whole = value.full_tensor()
    for global_ids, local_ids in ids:
        if whole.numel() == experts and torch.equal(
                whole.flatten(), torch.bincount(global_ids.full_tensor().flatten(), minlength=experts).to(whole.dtype)):
            return torch.bincount(local_ids.flatten(), minlength=experts).to(whole.dtype).view(whole.shape)
    raise PlanError(f"expert parallel: an input of the experts' caller, shape {list(value.shape)}, is neither "
                    "split by token nor a per-rank sum nor a count of tokens per expert",
                    hint="plan it without expert parallel")


def _rows_dtensor(value: torch.Tensor, mesh: DeviceMesh, rows: tuple, row_count: int) -> DTensor:
    shape = (row_count, *value.shape[1:])
    return DTensor.from_local(value, mesh, rows, run_check=False, shape=torch.Size(shape),
                              stride=_contiguous_strides(shape))


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def _as_dtensor(value: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    if isinstance(value, DTensor):
        return value
    return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
