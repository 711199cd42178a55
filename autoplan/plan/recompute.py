"""The collectives a checkpointed module's rerun adds to a step (``Plan.recompute``).

``apply_plan`` checkpoints a module's whole call (``apply/recompute.py``): its input hooks'
moves, its parameter gathers, the moves DTensor makes for its ops, its output hook. In the
backward the call runs again, and with it the forward collectives made inside it; not its
backward ones, which run once, as without the checkpoint. Measured (fake process group,
``verify.observe.CollectiveCounter``) and predicted here:

- the rerun stops as soon as it has made the last tensor the backward needs (torch's
  non-reentrant checkpoint, ``early_stop``): a forward collective repeats if it runs no
  later than the module's last op that saves a tensor for the backward (``_saves``). A
  row-parallel output reduced at the block's closing residual add, after the last matmul,
  does not repeat; one reduced before a norm does;
- a move runs where apply_plan or DTensor makes it: a boundary's and a parameter gather's
  when the module whose hook makes it is called (before its first op), DTensor's move of an
  op's input with that op, an output hook's move after the op that made the value;
- "selective" keeps the outputs of matmuls and attention (``recompute_policy.SELECTIVE_KEEPS``): the
  rerun hands back what they made without running them, and DTensor's moves of their
  inputs, made inside them, do not repeat. The moves of hooks and of other ops do.

Counted for the module that made them, as in the forward.
"""

from __future__ import annotations

from collections import Counter

import torch

from autoplan.choices.graph import OP
from autoplan.cost.estimate import is_view
from autoplan.recompute_policy import selective_keeps

aten = torch.ops.aten

SAVES_NOTHING = frozenset({
    aten.add.Tensor, aten.sub.Tensor, aten.neg.default, aten.cat.default, aten.clone.default,
    aten.mean.dim, aten.mean.default, aten.sum.dim_IntList, aten.sum.default, aten._to_copy.default,
    aten.zeros_like.default, aten.ones_like.default, aten.new_zeros.default, aten.new_ones.default,
})
"""Ops whose backward needs no tensor (a sum, a copy, a sign): autograd saves nothing for them."""


KEPT_BY_SELECTIVE = selective_keeps()
"""The traced ops whose outputs "selective" keeps (``recompute_policy.SELECTIVE_KEEPS``)."""


def recompute_collectives(choices, forward: list, recompute: dict[str, str]) -> Counter:
    """``(module, kind, axis, bytes) -> count`` that the reruns of ``recompute``'s modules add.

    ``forward``: ``(where, collective)`` for each forward collective of the step, ``where``
    one of ``("boundary", module)`` (an input hook), ``("gather", module)`` (a parameter
    gathered by its module's hook), ``("read", reader)`` (DTensor's move
    for op ``reader``), ``("exit", producer)`` (an output hook's move of what op
    ``producer`` made); ``collective`` as ``step_collectives`` keys it."""
    graph = choices.graph
    owners = choices.traced.node_modules
    order = {name: i for i, name in enumerate(graph.nodes)}
    first = _first_ops(graph, owners, order)
    added: Counter = Counter()
    for region, mode in recompute.items():
        inside = [name for name in graph.nodes if _within(owners.get(name) or "", region)]
        saving = [order[name] for name in inside if _saves(graph.decision(name))]
        if not saving:
            continue  # nothing kept for the backward: the call never runs again
        stop = max(saving)
        for where, collective in forward:
            if not _within(collective[0], region):
                continue
            kind, at = where
            if kind in ("boundary", "gather"):  # the module's hooks, before its first op
                runs_at: float | None = first.get(at)
            elif kind == "read":
                runs_at = order[at]
                if mode == "selective" and graph.decision(at).fx_node.target in KEPT_BY_SELECTIVE:
                    continue
            else:  # "exit": after the op that made the value
                runs_at = order[at] + 0.5
            if runs_at is not None and runs_at <= stop:
                added[collective] += 1
    return added


def _within(module: str, region: str) -> bool:
    return module == region or module.startswith(region + ".")


def _first_ops(graph, owners, order) -> dict[str, int]:
    """Module FQN -> the position of the first op its call runs (its own or a submodule's)."""
    first: dict[str, int] = {}
    for name in graph.nodes:
        parts = (owners.get(name) or "").split(".")
        for depth in range(1, len(parts) + 1):
            first.setdefault(".".join(parts[:depth]), order[name])
    return first


def _saves(decision) -> bool:
    """Whether autograd saves a tensor for the op's backward (what makes the rerun go on to it)."""
    if not decision.requires_grad or decision.kind != OP or is_view(decision):
        return False
    return decision.fx_node.target not in SAVES_NOTHING
