"""The layouts the solver may give an experts region: split over one mesh axis, or whole.

With ``suggest --expert-parallel`` each routed experts module (``trace/experts.py``) is
traced as one region (``trace/opaque.EXPERTS``): one op, fed the tokens ``(T, H)``, the
top-k expert index and weights ``(T, k)`` and the experts' parameters (leading size
``E``), returning ``(T, H)``. Its strategies are the layouts the apply engine can run
(``apply/expert_parallel.py``):

- **expert parallel over axis e** (``E`` divides by e's size): the parameters read
  ``Shard(0)`` on e (each rank its ``E/n`` experts) and whole on the other axes; the tokens,
  the index and the weights split by row on e and, per other axis, split by row or whole
  (as the engine keeps a row split it finds); the output as the tokens. Where the
  parameters are stored otherwise (split further on another axis, as FSDP does), the edge
  from the parameter prices the gather to this layout, as for any op;
- **whole**: everything replicated, every rank computing every token (the region run as
  one opaque module).

Priced as ops are (``cost/estimate.py``), and besides (``exchanges``): the token exchange
the engine runs per expert-parallel call, a dispatch and a combine ``all_to_all`` each
way (forward and backward) of ``rows x k x H`` values from each rank, the router's load
taken as even, and the count exchange (``E`` integers); and what the region keeps for its
backward, which the trace cannot see inside the region: per routed row, the row itself
and each expert matrix's output (``rows x k x sum(a + b)`` over the ``(E, a, b)``
matrices), also what its kernels read and write once more.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import fx

from autoplan.dtensor.strategy import Strategy
from autoplan.placements import REPLICATE, replicated, shard_factor
from autoplan.trace.opaque import EXPERTS, OPAQUE_OP

ROWS = "S(0)"
TOKEN_INPUTS = 3
"""The routed call's tensors before the parameters: tokens, top-k index, top-k weights."""
COUNT_BYTES = 8
"""Each rank's count of rows per expert (int64) in the count exchange."""


def is_expert_region(node: fx.Node, opaque_reasons: dict[str, str]) -> bool:
    """Whether ``node`` is an experts module traced as one region to lay out (its key is its FQN)."""
    return node.target is OPAQUE_OP and opaque_reasons.get(str(node.args[0])) == EXPERTS


def region_tensors(node: fx.Node) -> list[torch.Tensor]:
    """The region's tensors as traced: the call's (tokens, index, weights), then its parameters."""
    tensors = node.args[1]
    assert isinstance(tensors, (list, tuple)), tensors  # ``opaque_region(key, tensors)``
    return [a.meta["val"] for a in tensors if isinstance(a, fx.Node)]


def expert_count(node: fx.Node) -> int:
    """E: the leading size of the region's parameters."""
    return int(region_tensors(node)[TOKEN_INPUTS].shape[0])


def expert_strategies(node: fx.Node, mesh_shape: tuple[int, ...]) -> tuple[Strategy, ...]:
    """The region's layouts (see the module docstring): whole first, then expert parallel
    over each axis whose size divides ``E``, the rows split or whole on each other axis."""
    tensors = region_tensors(node)
    tokens, state = tensors[0], tensors[TOKEN_INPUTS:]
    experts = expert_count(node)
    rows = int(tokens.shape[0])
    ndim = len(mesh_shape)
    whole = Strategy((replicated(ndim),), tuple(replicated(ndim) for _ in tensors))
    found = [whole]
    for axis, size in enumerate(mesh_shape):
        if size < 2 or experts % size:
            continue
        others = [a for a, n in enumerate(mesh_shape) if a != axis and n > 1]
        params = tuple(ROWS if a == axis else REPLICATE for a in range(ndim))
        for count in range(len(others) + 1):
            for split in itertools.combinations(others, count):
                ways = size * math.prod(mesh_shape[a] for a in split)
                if rows % ways:
                    continue
                spec = tuple(ROWS if a == axis or a in split else REPLICATE for a in range(ndim))
                inputs = (spec,) * TOKEN_INPUTS + (params,) * len(state)
                found.append(Strategy((spec,), inputs))
    return tuple(found)


def expert_axis(strategy: Strategy) -> int | None:
    """The axis a region's strategy splits the experts over; None: whole."""
    params = strategy.inputs[TOKEN_INPUTS] if len(strategy.inputs) > TOKEN_INPUTS else ()
    return next((a for a, p in enumerate(params) if p == ROWS), None)


@dataclass(frozen=True)
class RegionCosts:
    collectives: tuple[tuple[str, int, float, bool], ...]
    """``(kind, axis, bytes, in the backward)`` of each exchange (bytes: each rank's buffer)."""
    held_bytes: float
    """What the region keeps for its backward, per rank."""
    traffic_bytes: float
    """What its kernels write and read beyond its inputs and outputs, per rank, forward."""


def region_costs(node: fx.Node, strategy: Strategy, mesh_shape: tuple[int, ...], requires_grad: bool) -> RegionCosts:
    """The exchanges, kept values and inner traffic of the region ``node`` under ``strategy``."""
    tensors = region_tensors(node)
    tokens, index, state = tensors[0], tensors[1], tensors[TOKEN_INPUTS:]
    rows = tokens.shape[0] / shard_factor(strategy.inputs[0], mesh_shape)
    top_k = int(index.shape[1]) if index.dim() > 1 else 1
    size = tokens.element_size()
    per_row = sum(int(p.shape[1]) + int(p.shape[2]) for p in state if p.dim() == 3)
    held = rows * top_k * per_row * size
    axis = expert_axis(strategy)
    collectives: list[tuple[str, int, float, bool]] = []
    if axis is not None:
        buffer = rows * top_k * int(tokens.shape[-1]) * size
        collectives.append(("all_to_all", axis, float(expert_count(node) * COUNT_BYTES), False))
        collectives += [("all_to_all", axis, buffer, False)] * 2
        if requires_grad:
            collectives += [("all_to_all", axis, buffer, True)] * 2
    return RegionCosts(tuple(collectives), held, 2 * held)
