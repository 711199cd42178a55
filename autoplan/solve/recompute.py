"""Activation checkpointing as a choice of the ILP: none, "full" or "selective" for the
first k of the repeated layers, decided with their layout.

Checkpointing a layer frees what autograd saved inside it (``NodeCost.recompute``: every
saved output under "full", all but matmul and attention outputs under "selective"; the
layer's own output stays, the next layer's checkpoint keeps it as its input, and costs
memory of its own where nothing else saved it: ``RecomputeUnit.inputs``) and reruns
its forward in the backward. The backward reaches the layers last to first, so with the
first k of N layers checkpointed, the N-k others have freed at least one layer's worth
before the first rerun makes one alive again: the peak is spared k/N of the stack's
saved bytes, and (N-1)/N with every layer checkpointed, no more than with all but the
last. The reruns repeat k/N of the stack's forward.

The mode is one for the stack (as torchtitan applies it), and k is what a budget needs:
``solve`` solves one model per (mode, k), each linear in the strategy binaries:

    memory row where the backward starts:  - min(k, N-1)/N * sum_v sum_i s[v,i] * freed_m[v,i]
                                           + k * sum_i s[x,i] * bytes[x,i]  (x: a layer's input)
    objective:                             + k/N * sum_v sum_i s[v,i] * rerun_m[v,i]

It starts each mode at k = N-1, then takes the fewest layers the layout found needs
(``fewest_layers``) and solves again, while that lowers k: each step is an exact optimum
for its k and no slower than the last. (One model with binaries for the modes needs big-M
rows to switch these on, which left HiGHS declaring feasible budgets infeasible on the
32-layer Llama-3-8B: 60 GiB "infeasible" between 50 and 70 GiB feasible.) Freed are the
layers' saved outputs and the moved copies of saved values read inside them
(``EdgeCost.kept_bytes``: the reruns move them again); "selective" also stores the outputs
it keeps that autograd would not have saved (``cost/estimate.py``). The reruns also repeat
the forward moves of what the layers' ops read (``EdgeCost.rerun_seconds``: parameter
gathers, input moves; ``rerun_edges``), priced with the ops' forward; ``plan/recompute.py``
predicts those collectives one by one (a rerun stops at the last op that saves a tensor,
which this pricing does not model: it errs towards checkpointing less).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoplan.cost.estimate import CostedGraph, recompute_rows
from autoplan.recompute_policy import selective_keeps

MODES = ("full", "selective")
"""Row pairs of ``NodeCost.recompute`` (rerun seconds, freed bytes), in this order."""
_GIB = 2**30
_NS = 1e9


@dataclass(frozen=True)
class RecomputeUnit:
    """The repeated layers that may be checkpointed, as the solver's problem holds them."""

    decisions: frozenset[str]
    """The problem's decisions inside the layers (tied: layer 0's, layer 1 folded in)."""
    freed: frozenset[str]
    """Those whose saved outputs a checkpoint frees: not the layers' own outputs."""
    layers: int
    """How many layers the model has (the decisions' costs count all of them)."""
    modules: tuple[str, ...]
    """FQNs of the traced layers, which the plan names."""
    forced: str | None = None
    """A mode the solution must take (scoring a plan that checkpoints): no choice left."""
    forced_layers: int | None = None
    """With ``forced``: how many of the first layers it checkpoints (None: every layer)."""
    inputs: frozenset[str] = frozenset()
    """The first traced layer's outputs that nothing saves: each checkpointed layer keeps
    such a value, its input, for its rerun (``input_bytes``)."""

    def freed_share(self, checkpointed: int) -> float:
        """Of the stack's saved bytes, what the peak is spared with the first ``checkpointed``
        layers checkpointed: theirs, less one layer's worth when every layer is (see the
        module docstring)."""
        return min(checkpointed, self.layers - 1) / self.layers if self.layers > 1 else 0.0

    def rerun_share(self, checkpointed: int) -> float:
        """Of the stack's forward, what the reruns repeat."""
        return checkpointed / self.layers


@dataclass
class RecomputeTerms:
    """What one mode adds to the model, linear in the strategy binaries."""

    freed_gib: list
    """Terms to add to the memory rows checkpointing lowers: the freed bytes (negative), and
    the inputs the checkpointed layers keep (positive)."""
    freed_constant_bytes: float
    """Their constant part (negative), from decisions with one strategy."""
    rerun_ns: list
    """Terms to add to the objective."""
    rerun_constant_ns: float


@dataclass
class _Linear:
    terms: list
    constant: float


def _linear(costed, s, names, row: int, scale: float, whole: bool = False) -> _Linear:
    """sum over ``names`` of s[v,i] * row[v][i] * scale (rounded to integers with ``whole``)."""
    terms: list = []
    constant = 0.0
    for name in sorted(names):
        if name not in costed.nodes:
            continue
        values = [v * scale for v in recompute_rows(costed.nodes[name])[row]]
        if whole:
            values = [round(v) for v in values]
        if isinstance(s[name], int):
            constant += values[s[name]]
        else:
            terms.extend((var, v) for var, v in zip(s[name], values) if v)
    return _Linear(terms, constant)


def recompute_terms(costed: CostedGraph, s: dict, unit: RecomputeUnit, mode: str, checkpointed: int) -> RecomputeTerms:
    """The first ``checkpointed`` layers checkpointed under ``mode``: what that frees (less
    the inputs the checkpoints keep) and reruns."""
    index = MODES.index(mode)
    freed = _linear(costed, s, unit.freed, 2 * index + 1, -unit.freed_share(checkpointed) / _GIB)
    for name in sorted(unit.inputs):
        per = [checkpointed * b / _GIB for b in _output_bytes(costed, name)]
        if isinstance(s[name], int):
            freed.constant += per[s[name]]
        else:
            freed.terms.extend((var, b) for var, b in zip(s[name], per) if b)
    rerun = _linear(costed, s, unit.decisions, 2 * index, unit.rerun_share(checkpointed) * _NS, whole=True)
    return RecomputeTerms(freed.terms, freed.constant * _GIB, rerun.terms, rerun.constant)


def input_bytes(costed: CostedGraph, choice: dict[str, int], inputs) -> float:
    """What one checkpointed layer keeps for its rerun that nothing else saves: its input,
    the previous layer's output (``RecomputeUnit.inputs``: the first traced layer's)."""
    return sum(_output_bytes(costed, name)[choice[name]] for name in inputs if name in choice)


def _output_bytes(costed: CostedGraph, name: str) -> list[float]:
    """Per strategy of ``name``: its first output's local bytes."""
    from autoplan.cost.estimate import output_values, tensor_bytes
    from autoplan.placements import shard_factor

    decision = costed.choices.graph.decision(name)
    values = output_values(decision)
    whole = tensor_bytes(values[0]) if values else 0.0
    return [whole / shard_factor(strategy.outputs[0], costed.choices.mesh_shape) if strategy.outputs and strategy.outputs[0]
            else 0.0 for strategy in decision.strategies]


def first_counts(unit: RecomputeUnit | None) -> list[tuple[str, int]]:
    """(mode, layers) ``solve`` starts from: the forced ones, else each mode on all layers but
    the last (which frees as much as all of them, for one layer's rerun less)."""
    if unit is None:
        return []
    if unit.forced is not None:
        return [(unit.forced, unit.forced_layers if unit.forced_layers is not None else unit.layers)]
    return [(mode, unit.layers - 1) for mode in MODES]


def fewest_layers(unit: RecomputeUnit, mode: str, start_bytes: float, freed_all_bytes: float, budget_bytes: float) -> int:
    """The fewest first layers to checkpoint under ``mode`` so that a layout whose
    backward-start peak is ``start_bytes`` unchecked fits ``budget_bytes``; its layers'
    saved bytes come to ``freed_all_bytes`` (the whole stack's, under ``mode``)."""
    if start_bytes <= budget_bytes:
        return 0
    if freed_all_bytes <= 0:
        return unit.layers - 1
    needed = math.ceil((start_bytes - budget_bytes) * unit.layers / freed_all_bytes - 1e-9)
    return max(1, min(needed, unit.layers - 1))


def leanest(unit: RecomputeUnit | None) -> tuple[str, int] | None:
    """The (mode, layers) that frees the most of what ``unit`` allows ("full" frees all
    "selective" does; all layers but the last free as much as all of them)."""
    if unit is None:
        return None
    return first_counts(unit)[0] if unit.forced is not None else ("full", unit.layers - 1)


def rerun_seconds(costed: CostedGraph, choice: dict[str, int], decisions, mode: str | None, share: float = 1.0) -> float:
    """The forward seconds the reruns of ``mode`` repeat, for the assignment ``choice``;
    ``share``: of the whole stack's forward."""
    return sum(rerun_parts(costed, choice, decisions, mode, share))


def rerun_parts(costed: CostedGraph, choice: dict[str, int], decisions, mode: str | None, share: float = 1.0):
    """``rerun_seconds`` as (the ops' compute, the moves of what they read: ``rerun_edges``)."""
    if mode is None:
        return 0.0, 0.0
    row = 2 * MODES.index(mode)
    ops = sum(recompute_rows(costed.nodes[n])[row][choice[n]] for n in decisions if n in costed.nodes)
    moves = 0.0
    for key in rerun_edges(costed, decisions, mode):
        edge = costed.edges[key]
        assert edge.rerun_seconds is not None  # rerun_edges lists only these
        moves += edge.rerun_seconds[edge.row_of[choice[key[0]]]][edge.col_of[choice[key[1]]]]
    return share * ops, share * moves


def rerun_edges(costed: CostedGraph, decisions, mode: str) -> list:
    """Edges whose move a rerun under ``mode`` repeats: into one of ``decisions`` (parameter
    gathers, input moves, DTensor's moves for an op); under "selective", not into an op
    whose output it keeps (the rerun hands that back without running it). In a fixed order."""
    keeps = selective_keeps() if mode == "selective" else frozenset()
    graph = costed.choices.graph
    return sorted(
        key for key, edge in costed.edges.items()
        if edge.rerun_seconds and key[1] in decisions and graph.decision(key[1]).fx_node.target not in keeps
    )


def freed_bytes(costed: CostedGraph, choice: dict[str, int], unit_freed, share: float, mode: str | None,
                inside=frozenset(), inputs=frozenset(), layers: int = 0) -> float:
    """The bytes the peak is spared under ``mode`` (the reruns' own activations left in):
    the saved outputs of ``unit_freed`` and the moved copies read inside the layers
    (``inside``, their decisions), which the reruns make again, less the inputs the
    ``layers`` checkpointed layers keep (``input_bytes``)."""
    if mode is None:
        return 0.0
    row = 2 * MODES.index(mode) + 1
    saved = sum(recompute_rows(costed.nodes[n])[row][choice[n]] for n in unit_freed if n in costed.nodes)
    return share * (saved + kept_inside_bytes(costed, choice, inside)) - layers * input_bytes(costed, choice, inputs)


def kept_inside_bytes(costed: CostedGraph, choice: dict[str, int], inside) -> float:
    """The moved copies of saved values (``EdgeCost.kept_bytes``) whose reader is in ``inside``."""
    total = 0.0
    for key in inside_edges(costed, inside):
        edge = costed.edges[key]
        assert edge.kept_bytes is not None  # inside_edges lists only these
        total += edge.kept_bytes[edge.row_of[choice[key[0]]]][edge.col_of[choice[key[1]]]]
    return total


def inside_edges(costed: CostedGraph, inside) -> list:
    """Edges with kept copies whose reader is one of the decisions ``inside``, in a fixed order."""
    return sorted(key for key, edge in costed.edges.items() if edge.kept_bytes and key[1] in inside)


def unit_for(layers_unit: RecomputeUnit | None, recompute) -> RecomputeUnit | None:
    """The unit a solve gets: none (``recompute`` False), free to choose (True), or held to
    one mode on every layer (a mode's name) or on the first layers ((mode, layers))."""
    if layers_unit is None or recompute is False:
        return None
    if recompute is True:
        return layers_unit
    mode, layers = recompute if isinstance(recompute, tuple) else (recompute, None)
    return replace(layers_unit, forced=mode, forced_layers=layers)


def stack_checkpointing(recompute: dict[str, str], modules: tuple[str, ...] | None) -> tuple[str, int] | None:
    """(mode, k) where a plan's ``recompute`` checkpoints the first k layers of a stack (whose
    layers are ``modules``, every layer's FQN, in order) alike and nothing else; else None."""
    if not recompute or not modules or len(set(recompute.values())) != 1:
        return None
    count = len(recompute)
    if set(recompute) != set(modules[:count]):
        return None
    return next(iter(recompute.values())), count
