"""Plan with context parallel: the batch's sequence split over one mesh axis.

``suggest_context_parallel`` solves the planning problem twice: with the sequence inputs
pinned split on their sequence dim on the context axis (``dtensor/context_attention.py``
runs attention over that split), and, unless told not to, as ``suggest`` plans it (no
sequence split), on the batch without what ``sequence_batch.causal_lm_batch`` added. It
keeps the cheaper step, under the same memory budget; the plan kept records the context
layout and what the other one costs (``Plan.context_parallel``). Both
are priced by their own step (``repricing.py``): the context plan's dry run runs the
keys' and values' all-gathers and their gradients' reduce-scatters, so they are in its
``module_collectives`` with the axis's link price.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from autoplan.dtensor import context_attention
from autoplan.dtensor.strategy import Strategy
from autoplan.errors import InfeasibleError, PlanError
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import prepare_problem, resolve_options, solve_problem
from autoplan.pipeline.suggest import suggest_with_report
from autoplan.plan.module_plan import ContextLayout, Plan
from autoplan.sequence_batch import without_added_keys
from autoplan.tree_paths import keyed_leaves

SEQ_DIM = 1  # of a batch input (batch, sequence, ...)
UNSPLIT_INPUTS = ("attention_mask",)
"""Batch keys left whole on the context axis: transformers' padding mask. Context parallel
runs only a mask of ones (no padding), which is the same in any order; whole, the model's
check that it is all ones (``sum() == numel()``) reads it without a collective, which a
dry run on a fake process group could not answer (it would build a mask the run never has)."""


@dataclass(frozen=True)
class ContextChoice:
    plan: Plan
    """The plan kept: the cheaper of the two."""
    context_step_s: float
    """The step predicted with the sequence split on the context axis."""
    plain_step_s: float | None
    """The step predicted without it (None: not solved, ``compare=False``)."""
    context_fits: bool
    plain_fits: bool | None
    context_plan: Plan
    """The plan with the sequence split (kept or not)."""
    plain_plan: Plan | None
    """The plan without it (None: not solved, or none fits)."""


def sequence_inputs(batch, seq_len: int | None = None) -> tuple[str, ...]:
    """The batch's keys whose dim 1 is the sequence: every tensor of two dims or more whose
    dim 1 has ``seq_len`` (default: the first such tensor's dim 1), but ``UNSPLIT_INPUTS``."""
    found = []
    for path, leaf in keyed_leaves(_as_call(batch)):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() < 2:
            continue
        if seq_len is None:
            seq_len = leaf.shape[SEQ_DIM]
        if leaf.shape[SEQ_DIM] == seq_len and not any(path == f"[1]['{key}']" for key in UNSPLIT_INPUTS):
            found.append(path)
    return tuple(found)


def suggest_context_parallel(
    model, batch, mesh, axis_names, context_axis: str, *, profile=None, memory_gib: float | None = None,
    time_limit_s: float | None = None, recompute: bool = True, compare: bool = True, loss_fn=None, progress=None,
) -> ContextChoice:
    """Plan ``model`` with its sequence split over ``context_axis`` (and, with ``compare``,
    without); the cheaper plan that fits is kept."""
    mesh_shape, names, _, _ = resolve_options(mesh, axis_names, profile, None, memory_gib)
    if context_axis not in names:
        raise PlanError(f"context axis {context_axis!r} is not one of the mesh's axes {list(names)}",
                        hint="name one of the mesh's axes (--axis-names) as the context axis")
    axis = names.index(context_axis)
    size = mesh_shape[axis]
    keys = sequence_inputs(batch)
    if not keys:
        raise PlanError("context parallel needs batch inputs of shape (batch, sequence, ...)",
                        hint="pass token ids (and labels, position ids) as tensors with the sequence on dim 1")
    context_attention.sequence_order(_seq_len(batch, keys[0]), size)  # a clear error if it cannot be split evenly
    with context_attention.active(axis):
        problem = prepare_problem(model, batch, mesh_shape, names, profile, memory_gib=memory_gib, tie=True,
                                  loss_fn=loss_fn, progress=progress)
        pins = Pins(problem)
        for key in keys:
            node = problem.node_of(key)
            if node is None:
                raise PlanError(f"batch input {key!r} is not read by the model", hint="leave it out of the batch")
            pins.require(node, functools.partial(_output_split_on, axis=axis), f"{key} split on its sequence on {context_axis}",
                         strict=True)
        for key in UNSPLIT_INPUTS:
            node = problem.node_of(f"[1]['{key}']")
            if node is not None:
                pins.require(node, functools.partial(_output_whole_on, axis=axis), f"{key} whole on {context_axis}",
                             strict=True)
        plan, _solution, fits = solve_problem(problem, pins, time_limit_s, progress=progress, recompute=recompute,
                                              reprice=True, over_budget=True)
    context_step = plan.predicted.step_time_s
    plain_step, plain_fits, plain = None, None, None
    if compare:
        # The batch as it is without a split sequence: with the position ids and the mask of
        # ones the model cannot read while traced, it would be planned with a causal mask
        # built in every layer, which its run never has (sequence_batch.ADDED_KEYS).
        plain_batch = without_added_keys(batch) if isinstance(batch, dict) else batch
        try:
            plain, _report = suggest_with_report(model, plain_batch, mesh_shape, names, profile, memory_gib=memory_gib,
                                                 time_limit_s=time_limit_s, recompute=recompute, loss_fn=loss_fn,
                                                 progress=progress)
            plain_step, plain_fits = plain.predicted.step_time_s, True
        except InfeasibleError:
            plain_fits = False  # no plan without the sequence split fits the budget
    layout = ContextLayout(context_axis, axis, size, sequence_inputs=keys, alternative_step_s=plain_step)
    with_context = replace(plan, context_parallel=layout)
    kept = with_context
    if plain is not None and plain_step is not None and (not fits or plain_step < context_step):
        kept = plain
    return ContextChoice(kept, context_step, plain_step, fits, plain_fits, with_context, plain)


def _output_split_on(strategy: Strategy, axis: int) -> bool:
    spec = strategy.output(0)
    return spec is not None and spec[axis] == f"S({SEQ_DIM})"


def _output_whole_on(strategy: Strategy, axis: int) -> bool:
    spec = strategy.output(0)
    return spec is not None and spec[axis] == "R"


def _seq_len(batch, key: str) -> int:
    for path, leaf in keyed_leaves(_as_call(batch)):
        if path == key and isinstance(leaf, torch.Tensor):
            return int(leaf.shape[SEQ_DIM])
    raise AssertionError(key)


def _as_call(batch) -> tuple[tuple, dict]:
    """The batch as the model is called with it (``apply/engine.py`` ``shard_batch`` keys it so)."""
    if isinstance(batch, dict):
        return (), dict(batch)
    return (tuple(batch), {}) if isinstance(batch, (tuple, list)) else ((batch,), {})
