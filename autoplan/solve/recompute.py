"""Activation checkpointing as a choice of the ILP: none, "full" or "selective" for the
repeated layers, decided with their layout.

Checkpointing a layer frees what autograd saved inside it (``NodeCost.recompute``: every
saved output under "full", all but matmul and attention outputs under "selective"; the
layer's own output stays, the next layer's checkpoint keeps it as its input) and reruns
its forward in the backward. While a layer's backward runs, its rerun activations are
alive again, so of N checkpointed layers N-1 layers' worth is freed at the step's peak.
Every layer is checkpointed alike (as torchtitan applies it), so there is one choice per
stack of repeated layers:

    r_full + r_sel <= 1                                  binaries
    z_m <= (N-1)/N * sum_v sum_i s[v,i] * freed_m[v,i]   bytes freed under mode m
    z_m <= Z_m * r_m                                     (only where m is chosen)
    t_m >= sum_v sum_i s[v,i] * rerun_m[v,i] - T_m * (1 - r_m),  t_m >= 0

The memory row where the backward starts subtracts z_full + z_sel, the objective adds
t_full + t_sel: the forward compute the reruns repeat. The collectives a rerun repeats are
not priced here (``plan/recompute.py`` predicts them); the saved copies of moved values
(``EdgeCost.kept_bytes``) are not counted as freed. Both err on the side of checkpointing
less.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ortools.math_opt.python import mathopt

from autoplan.cost.estimate import CostedGraph, recompute_rows

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

    @property
    def share(self) -> float:
        """Of the layers' saved bytes, what the peak is spared (one layer reruns at a time)."""
        return (self.layers - 1) / self.layers if self.layers > 1 else 0.0


@dataclass
class RecomputeVars:
    chosen: dict[str, object]
    """Mode -> its binary."""
    freed_gib: list
    """Terms to subtract from the memory row where the backward starts."""
    rerun_ns: list
    """Terms to add to the objective."""


def add_recompute(model, costed: CostedGraph, s: dict, unit: RecomputeUnit) -> RecomputeVars:
    chosen = {mode: model.add_binary_variable(name=f"recompute[{mode}]") for mode in MODES}
    model.add_linear_constraint(mathopt.fast_sum(chosen.values()) <= 1)
    if unit.forced is not None:
        model.add_linear_constraint(chosen[unit.forced] == 1)
    freed_gib, rerun_ns = [], []
    for index, mode in enumerate(MODES):
        freed = _linear(costed, s, unit.freed, 2 * index + 1, unit.share / _GIB)
        rerun = _linear(costed, s, unit.decisions, 2 * index, _NS, whole=True)
        z = model.add_variable(lb=0.0, ub=max(freed.most, 0.0), name=f"freed[{mode}]")
        model.add_linear_constraint(z <= mathopt.fast_sum(freed.terms) + freed.constant)
        model.add_linear_constraint(z <= freed.most * chosen[mode])
        t = model.add_variable(lb=0.0, name=f"rerun[{mode}]")
        model.add_linear_constraint(t >= mathopt.fast_sum(rerun.terms) + rerun.constant - rerun.most * (1 - chosen[mode]))
        freed_gib.append(-z)
        rerun_ns.append(t)
    return RecomputeVars(chosen, freed_gib, rerun_ns)


def chosen_mode(values, variables: RecomputeVars | None) -> str | None:
    if variables is None:
        return None
    return next((mode for mode, var in variables.chosen.items() if values[var] > 0.5), None)


def rerun_seconds(costed: CostedGraph, choice: dict[str, int], decisions, mode: str | None) -> float:
    """The forward seconds the reruns of ``mode`` repeat, for the assignment ``choice``."""
    if mode is None:
        return 0.0
    row = 2 * MODES.index(mode)
    return sum(recompute_rows(costed.nodes[n])[row][choice[n]] for n in decisions if n in costed.nodes)


def freed_bytes(costed: CostedGraph, choice: dict[str, int], unit_freed, share: float, mode: str | None) -> float:
    """The bytes the peak is spared under ``mode`` (the reruns' own activations left in)."""
    if mode is None:
        return 0.0
    row = 2 * MODES.index(mode) + 1
    return share * sum(recompute_rows(costed.nodes[n])[row][choice[n]] for n in unit_freed if n in costed.nodes)


@dataclass
class _Linear:
    terms: list
    constant: float
    most: float


def _linear(costed, s, names, row: int, scale: float, whole: bool = False) -> _Linear:
    """sum over ``names`` of s[v,i] * row[v][i] * scale (rounded to integers with ``whole``)."""
    terms, constant, most = [], 0.0, 0.0
    for name in sorted(names):
        if name not in costed.nodes:
            continue
        values = [v * scale for v in recompute_rows(costed.nodes[name])[row]]
        if whole:
            values = [round(v) for v in values]
        most += max(values, default=0.0)
        if isinstance(s[name], int):
            constant += values[s[name]]
        else:
            terms.extend(var * v for var, v in zip(s[name], values) if v)
    return _Linear(terms, constant, most)


def unit_for(layers_unit: RecomputeUnit | None, recompute: bool | str) -> RecomputeUnit | None:
    """The unit a solve gets: none (``recompute`` False), free to choose (True), or held to
    one mode (a mode's name)."""
    if layers_unit is None or recompute is False:
        return None
    return layers_unit if recompute is True else replace(layers_unit, forced=recompute)


def uniform_mode(recompute: dict[str, str], modules: tuple[str, ...] | None) -> str | None:
    """The one mode a plan's ``recompute`` gives every layer of a stack (whose layers are
    ``modules``, every layer's FQN), or None where it names other modules or mixes modes."""
    if not recompute or not modules or set(recompute) != set(modules) or len(set(recompute.values())) != 1:
        return None
    return next(iter(recompute.values()))
