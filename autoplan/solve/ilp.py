"""Stage 4: pick one strategy per decision by an integer linear program (OR-Tools MathOpt, HiGHS).

Sets: decisions V, each with strategies I_v; edges E = (u, v, k) with rows R_e (distinct
specs u can output) and columns C_e (distinct specs v can require at input k).

Variables
    s[v, i] in {0, 1}           decision v uses strategy i                (_add_strategy_vars)
    e[uvk, r, c] in [0, 1]      producer shows spec r, consumer wants c  (_add_edge_vars)

Objective (integer nanoseconds)
    min  sum_v sum_i s[v,i] * (compute[v,i] + comm[v,i])
       + sum_e sum_{r,c} e[e,r,c] * reshard[e,r,c]                       (_objective)

Constraints
    sum_i s[v,i] = 1                                   one strategy each  (_add_strategy_vars)
    sum_c e[e,r,c] = sum_{i: row(i)=r} s[u,i]          edge rows match u  (_add_edge_vars)
    sum_r e[e,r,c] = sum_{j: col(j)=c} s[v,j]          edge cols match v  (_add_edge_vars)
    sum_v sum_i s[v,i] * memory[v,i]                   memory where the   (_add_memory_limit)
       + sum_e sum_{r,c} e[e,r,c] * kept[e,r,c] <= budget   backward starts
    sum_v sum_i s[v,i] * end[v,i] <= budget            ... where it ends  (_add_memory_limit)

With a stack of repeated layers, checkpointing them is a choice too: one model per mode
(none, "full", "selective") and count of layers, what that frees subtracted from the first
memory row and the reruns' forward compute added to the objective; the fastest plan wins
(``solve/recompute.py``). Where the fastest plan with no budget fits, it is the answer.

Edges with no variables: an edge whose cost is zero, or depends on one end alone (one row,
one column, or an end with a single strategy), is added to that end's strategy costs
instead (_edge_folds): exact, and it keeps the model small.

The edge linking is the tight (transportation) form: with one-hot s the margins are
one-hot and e is the product s_u * s_v, so e can be continuous. Edges are aggregated
over distinct specs, not strategy pairs, which keeps them small.

Coefficients are whole nanoseconds: rounding once, here, makes equal costs compare equal
however they were summed, so ties break the same way on every run; the reported
objective is recomputed from the unrounded costs of the chosen plan.

HiGHS runs with a fixed seed and its default (deterministic) parallelism, so the same model
gives the same answer unless the time limit cuts the search. It starts from a feasible
plan (``solve/warm_start.py``), so a time limit always returns a plan, with its gap to the
best bound the solver proved.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass, replace

from ortools.math_opt.python import mathopt

from autoplan.choices.graph import INPUT, OP
from autoplan.cost.estimate import CostedGraph
from autoplan.errors import InfeasibleError
from autoplan.solve.linear_model import LinearModel
from autoplan.solve.recompute import (
    RecomputeUnit,
    fewest_layers,
    first_counts,
    freed_bytes,
    inside_edges,
    leanest,
    recompute_terms,
    rerun_edges,
    rerun_seconds,
)
from autoplan.solve.warm_start import forward_bytes, greedy_start, peak_bytes, start_bytes

NS = 1e9  # objective unit: nanoseconds
TIE_BREAK_NS = 1
"""Charged per sharded or partial output placement, and removed from the reported objective.

Among plans of equal cost (a value nothing differentiates, such as rotary tables that
are as cheap sliced as whole), the solver then picks the replicated layout: it is what a
person would write, and DTensor's run-time propagation on N-D meshes gets much slower
for needlessly mixed layouts."""


@dataclass(frozen=True, slots=True)
class Solution:
    choice: dict[str, int]
    """Decision -> index of the chosen strategy."""
    status: str
    """"optimal", or "feasible" when the time limit stopped the search early."""
    objective_s: float
    bound_s: float
    gap: float
    variables: int
    constraints: int
    wall_s: float
    """Building the model and searching."""
    search_s: float = 0.0
    """Wall time inside the solver (what the time limit bounds)."""
    search_cpu_s: float = 0.0
    """CPU time inside the solver (on a loaded machine, the part of the wall time that was ours)."""
    stopped_by_time_limit: bool = False
    """The search ended at the time limit. HiGHS looks at its clock between steps, so it
    finishes the step it is in first (a presolve pass of a 100k-variable model: about 1 s)."""
    recompute: str | None = None
    """How the repeated layers are checkpointed: "full", "selective" or None (``solve/recompute.py``)."""
    recompute_layers: int = 0
    """How many of them, from the first."""


def solve(
    costed: CostedGraph,
    memory_budget_bytes: float,
    time_limit_s: float | None = None,
    allowed: dict[str, set[int]] | None = None,
    recompute: RecomputeUnit | None = None,
    budget_words: str | None = None,
    excluded: tuple[dict[str, int], ...] = (),
) -> Solution:
    """Optimal strategies under the budget; ``allowed`` restricts some decisions (pinning);
    ``recompute``: the layers that may be checkpointed (``solve/recompute.py``: one model
    per mode and count of layers, the fastest plan kept; the time limit holds for each).
    ``budget_words``: the budget as the user gave it, for the error when nothing fits.
    ``excluded``: partial assignments no answer may repeat whole (the layouts of candidate
    plans already priced by their step, ``pipeline/repricing.py``)."""
    started = time.perf_counter()
    allowed = allowed or {}
    tried: list[Solution] = []

    def attempt(budget: float, mode: str | None = None, layers: int = 0) -> Solution | None:
        found = _solve_mode(costed, budget, time_limit_s, allowed, recompute, mode, layers, excluded)
        tried.append(found)
        return found if found.status in ("optimal", "feasible") else None

    best = None
    if recompute is None or recompute.forced is None:
        if recompute is not None and math.isfinite(memory_budget_bytes):
            # The fastest plan of all: where it fits, checkpointing has nothing to win.
            fastest = attempt(math.inf)
            if fastest is not None and peak_bytes(costed, fastest.choice) <= memory_budget_bytes:
                return _with_totals(fastest, tried, started)
        best = attempt(memory_budget_bytes)
    for mode, layers in first_counts(recompute):
        assert recompute is not None  # first_counts is empty without it
        found = attempt(memory_budget_bytes, mode, layers)
        while found is not None and recompute.forced is None:
            freed_all = freed_bytes(costed, found.choice, recompute.freed, 1.0, mode, recompute.decisions, recompute.inputs,
                                    recompute.layers)
            held = max(start_bytes(costed, found.choice), forward_bytes(costed, found.choice))  # the rows checkpointing lowers
            fewer = fewest_layers(recompute, mode, held, freed_all, memory_budget_bytes)
            if not 0 < fewer < found.recompute_layers:
                break  # none: the layout fits unchecked, which the solve without checkpointing covers
            again = attempt(memory_budget_bytes, mode, fewer)
            if again is None or again.objective_s >= found.objective_s:
                break
            found = again
        if found is not None and (best is None or found.objective_s < best.objective_s):
            best = found  # ties keep what was tried first: checkpointing less
    if best is None:
        if any(t.status == "out_of_time" for t in tried):
            raise InfeasibleError(
                f"the solver found no plan within the {time_limit_s:g} s time limit",
                hint="raise --time-limit",
            )
        need = least_memory_bytes(costed, allowed, time_limit_s, recompute)
        err = InfeasibleError(
            f"no plan fits the per-device budget of {budget_words or f'{memory_budget_bytes / 2**30:.4g} GiB'} "
            f"(the smallest possible needs {need / 2**30:.4g} GiB, {round(need):,} bytes)",
            hint="raise --memory-gb (or --memory-gib), use a mesh with more devices, or a smaller batch",
        )
        err.smallest_bytes = need
        raise err
    return _with_totals(best, tried, started)


def _with_totals(best: Solution, tried: list[Solution], started: float) -> Solution:
    """``best`` with the wall and search times of every model solved to find it."""
    return replace(best, wall_s=time.perf_counter() - started, search_s=sum(t.search_s for t in tried),
                   search_cpu_s=sum(t.search_cpu_s for t in tried))


def _checkpoint_terms(costed, s, e, unit: RecomputeUnit, mode: str, layers: int):
    """``recompute_terms`` with the moved copies read inside the layers freed as well, and
    the moves the reruns repeat priced."""
    checkpoint = recompute_terms(costed, s, unit, mode, layers)
    terms, constant = _grid_terms(costed, s, e, inside_edges(costed, unit.decisions), -unit.freed_share(layers) / 2**30, _kept)
    checkpoint.freed_gib.extend(terms)
    checkpoint.freed_constant_bytes += constant * 2**30
    terms, constant = _grid_terms(costed, s, e, rerun_edges(costed, unit.decisions, mode), unit.rerun_share(layers) * NS,
                                  _rerun, whole=True)
    checkpoint.rerun_ns.extend(terms)
    checkpoint.rerun_constant_ns += constant
    return checkpoint


def _grid_terms(costed, s, e, keys, scale: float, grid_of, whole: bool = False) -> tuple[list, float]:
    """sum over the edges ``keys`` of their grid (``grid_of``: kept bytes, rerun seconds) times
    ``scale`` (rounded to integers with ``whole``), in the edge variables where the edge has
    them, else in the end that decides it (as ``_grid_folds``)."""

    def scaled(value: float) -> float:
        return round(value * scale) if whole else value * scale

    terms: list = []
    constant = 0.0
    for key in keys:
        edge, (u, v, _) = costed.edges[key], key
        grid = grid_of(edge)
        if key in e:
            terms.extend((var, scaled(grid[r][c])) for r, cells in enumerate(e[key]) for c, var in enumerate(cells) if grid[r][c])
            continue
        folded = _by_one_end(edge, grid, s[u], s[v])
        if folded is None:
            continue
        side, per = folded
        end = s[v] if side == "v" else s[u]
        if isinstance(end, int):
            constant += scaled(per[end])
        else:
            terms.extend((var, scaled(b)) for var, b in zip(end, per) if b)
    return terms, constant


def _solve_mode(costed, memory_budget_bytes, time_limit_s, allowed, recompute, mode, layers, excluded=()) -> Solution:
    """The optimum with the first ``layers`` layers checkpointed under ``mode`` (None: none
    checkpointed); its status "infeasible" or "out_of_time" where it found no plan."""
    started = time.perf_counter()
    model = LinearModel(name="autoplan")
    s = _add_strategy_vars(model, costed)
    _pin(model, s, allowed)
    for assignment in excluded:
        _exclude(model, s, assignment)
    e = _add_edge_vars(model, costed, s)
    checkpoint = _checkpoint_terms(costed, s, e, recompute, mode, layers) if mode is not None else None
    _add_memory_limit(model, costed, s, e, memory_budget_bytes, checkpoint)
    terms, constant = _objective(costed, s, e)
    if checkpoint:
        terms.extend(checkpoint.rerun_ns)
        constant += checkpoint.rerun_constant_ns
    model.minimize(terms, constant)
    counts = model.variable_count, model.row_count
    built = model.build()

    params = mathopt.SolveParameters(
        random_seed=0,
        relative_gap_tolerance=1e-6,
        time_limit=datetime.timedelta(seconds=time_limit_s) if time_limit_s else None,
    )
    start = greedy_start(costed, memory_budget_bytes, allowed)
    hint = mathopt.ModelSolveParameters(solution_hints=[_hint(built, costed, s, e, start)])
    searching, searching_cpu = time.perf_counter(), time.process_time()
    result = mathopt.solve(built, mathopt.SolverType.HIGHS, params=params, model_params=hint)
    search_s, search_cpu_s = time.perf_counter() - searching, time.process_time() - searching_cpu
    reason = result.termination.reason
    stopped = result.termination.limit == mathopt.Limit.TIME
    if reason in (mathopt.TerminationReason.INFEASIBLE,
        mathopt.TerminationReason.INFEASIBLE_OR_UNBOUNDED) or not result.has_primal_feasible_solution():
        status = "out_of_time" if reason == mathopt.TerminationReason.NO_SOLUTION_FOUND else "infeasible"
        return Solution({}, status, math.inf, math.inf, 0.0, 0, 0, 0.0, search_s, search_cpu_s, stopped, mode, layers)
    values = {var.id: value for var, value in result.variable_values().items()}
    choice = {}
    for name, variables in s.items():
        if isinstance(variables, int):
            choice[name] = variables
        else:
            choice[name] = max(range(len(variables)), key=lambda i: (values[variables[i]], -i))
    objective = plan_seconds(costed, choice)
    if mode is not None:
        objective += rerun_seconds(costed, choice, recompute.decisions, mode, recompute.rerun_share(layers))
    optimal = reason == mathopt.TerminationReason.OPTIMAL
    # Every cost is >= 0, so 0 bounds the optimum when the solver proved nothing better.
    found, proved = result.objective_value(), max(0.0, result.best_objective_bound())
    gap = 0.0 if optimal or found <= 0 else max(0.0, (found - proved) / found)
    bound = objective * (1.0 - gap)
    return Solution(
        choice=choice,
        status="optimal" if optimal else "feasible",
        objective_s=objective,
        bound_s=bound,
        gap=gap,
        variables=counts[0],
        constraints=counts[1],
        wall_s=time.perf_counter() - started,
        search_s=search_s,
        search_cpu_s=search_cpu_s,
        stopped_by_time_limit=stopped,
        recompute=mode,
        recompute_layers=layers if mode is not None else 0,
    )


def plan_seconds(costed: CostedGraph, choice: dict[str, int]) -> float:
    """Step time of one assignment of the problem's decisions, from its unrounded costs."""
    total = sum(cost.compute_s[choice[n]] + cost.comm_s[choice[n]] for n, cost in costed.nodes.items())
    for (u, v, _), edge in costed.edges.items():
        total += edge.seconds[edge.row_of[choice[u]]][edge.col_of[choice[v]]]
    return total


def _hint(model: mathopt.Model, costed, s, e, start: dict[str, int]):
    """The warm start as values for every variable (edge variables: the product of the two ends)."""
    values: dict[int, float] = {}
    for name, variables in s.items():
        if not isinstance(variables, int):
            for i, var in enumerate(variables):
                values[var] = 1.0 if i == start[name] else 0.0
    for (u, v, k), grid in e.items():
        edge = costed.edges[(u, v, k)]
        row, col = edge.row_of[start[u]], edge.col_of[start[v]]
        for r, cells in enumerate(grid):
            for c, var in enumerate(cells):
                values[var] = 1.0 if (r, c) == (row, col) else 0.0
    return mathopt.SolutionHint(variable_values={model.get_variable(i, validate=False): v for i, v in values.items()})


def least_memory_bytes(
    costed: CostedGraph, allowed: dict[str, set[int]], time_limit_s: float | None = None,
    recompute: RecomputeUnit | None = None,
) -> float:
    """The least peak any plan reaches (what an infeasible budget is told it needs):
    min m subject to both memory rows <= m, over the same variables. The per-decision
    bound (``minimum_memory_bytes``) can fall short of every real plan: the copies a
    layout keeps live on edges, between two decisions' choices."""
    model = LinearModel(name="autoplan-least-memory")
    s = _add_strategy_vars(model, costed)
    _pin(model, s, allowed)
    e = _add_edge_vars(model, costed, s)
    peak = model.variable(0.0, math.inf, name="peak_gib")
    leanest_choice = leanest(recompute)
    checkpoint = (_checkpoint_terms(costed, s, e, recompute, *leanest_choice)
                  if recompute is not None and leanest_choice is not None else None)
    for terms, constant in _memory_rows(costed, s, e, checkpoint):
        model.row([*terms, (peak, -1.0)], upper=0.0, constant=constant / 2**30)
    model.minimize([(peak, 1.0)])
    params = mathopt.SolveParameters(
        random_seed=0, time_limit=datetime.timedelta(seconds=time_limit_s) if time_limit_s else None,
    )
    result = mathopt.solve(model.build(), mathopt.SolverType.HIGHS, params=params)
    if not result.has_primal_feasible_solution():
        return minimum_memory_bytes(costed)
    if result.termination.reason == mathopt.TerminationReason.OPTIMAL:
        return result.objective_value() * 2**30  # a plan that needs this much exists
    # Stopped early: the proved bound, never above what the leanest plan needs.
    return max(minimum_memory_bytes(costed), result.best_objective_bound() * 2**30)


def minimum_memory_bytes(costed: CostedGraph) -> float:
    """Memory of the leanest strategy everywhere: a lower bound on any plan's peak."""
    start = sum(min(cost.memory_bytes) for cost in costed.nodes.values())
    start += sum(min(min(row) for row in edge.kept_bytes) for edge in costed.edges.values() if edge.kept_bytes)
    end = sum(min(cost.end_bytes) for cost in costed.nodes.values() if cost.end_bytes)
    return max(start, end)


def _add_strategy_vars(model, costed):
    """s[v] is a list of binaries, or the index itself when v has one strategy."""
    s = {}
    for name, cost in costed.nodes.items():
        count = len(cost.compute_s)
        if count == 1:
            s[name] = 0
            continue
        variables = [model.binary(f"s[{name},{i}]") for i in range(count)]
        model.equal([(var, 1.0) for var in variables], 1.0)
        s[name] = variables
    return s


def _pin(model, s, allowed):
    """s[v,i] = 0 for every strategy i of v outside ``allowed[v]``."""
    for name, keep in allowed.items():
        variables = s[name]
        if isinstance(variables, int):
            if variables not in keep:
                raise InfeasibleError(f"decision {name} cannot take the pinned layout", hint="check the pinned placements")
            continue
        for i, var in enumerate(variables):
            if i not in keep:
                model.equal([(var, 1.0)], 0.0)


def _exclude(model, s, assignment: dict[str, int]) -> None:
    """No answer takes every strategy of ``assignment`` at once (a no-good cut): at least
    one of those decisions differs. Decisions with one strategy cannot differ and drop out."""
    free = [s[name][index] for name, index in assignment.items() if not isinstance(s[name], int)]
    fixed_elsewhere = any(isinstance(s[name], int) and s[name] != index for name, index in assignment.items())
    if fixed_elsewhere:
        return  # the assignment cannot happen anyway
    model.row([(var, 1.0) for var in free], upper=len(free) - 1)


def _match(model: LinearModel, cells: list[int], s_v, members: list[int]) -> None:
    """sum(cells) = sum of s_v over ``members`` (a constant where s_v is fixed)."""
    if isinstance(s_v, int):
        model.equal([(var, 1.0) for var in cells], 1.0 if s_v in members else 0.0)
    else:
        model.equal([*((var, 1.0) for var in cells), *((s_v[i], -1.0) for i in members)], 0.0)


def _add_edge_vars(model, costed, s):
    """Edge variables where both ends vary; other edges' costs go to one end (``_edge_folds``)."""
    e = {}
    for key, edge in costed.edges.items():
        u, v, _ = key
        if _folded(edge, s[u], s[v]):
            continue
        rows = [[i for i, r in enumerate(edge.row_of) if r == row] for row in range(len(edge.rows))]
        cols = [[j for j, c in enumerate(edge.col_of) if c == col] for col in range(len(edge.cols))]
        grid = [[model.variable() for _ in edge.cols] for _ in edge.rows]
        for r, members in enumerate(rows):
            _match(model, grid[r], s[u], members)
        for c, members in enumerate(cols):
            _match(model, [grid[r][c] for r in range(len(rows))], s[v], members)
        e[key] = grid
    return e


def _folded(edge, s_u, s_v) -> bool:
    """True when the edge needs no variables: its cost is zero, or a function of one end alone
    (one row or one column, or an end with a single strategy)."""
    if not any(round(t * NS) for row in edge.seconds for t in row):
        return True
    return len(edge.rows) == 1 or len(edge.cols) == 1 or isinstance(s_u, int) or isinstance(s_v, int)


def _edge_folds(costed, s) -> dict[str, list[int]]:
    """Per decision, the cost (ns) of each strategy from folded edges (``_folded``).

    An edge whose producer side is fixed (one row, or a producer with one strategy) costs
    ``reshard[row(u), col(j)]`` for the consumer's strategy j: linear in s[v]; likewise the
    other way round. Where both sides are fixed it is a constant, kept on the consumer.
    """
    extra = {name: [0] * len(cost.compute_s) for name, cost in costed.nodes.items()}
    for (u, v, _), edge in costed.edges.items():
        if not _folded(edge, s[u], s[v]):
            continue
        fixed_row = 0 if len(edge.rows) == 1 else edge.row_of[s[u]] if isinstance(s[u], int) else None
        if fixed_row is not None:
            for j, col in enumerate(edge.col_of):
                extra[v][j] += round(edge.seconds[fixed_row][col] * NS)
            continue
        fixed_col = 0 if len(edge.cols) == 1 else edge.col_of[s[v]] if isinstance(s[v], int) else None
        if fixed_col is not None:
            for i, row in enumerate(edge.row_of):
                extra[u][i] += round(edge.seconds[row][fixed_col] * NS)
        # else: an all-zero edge, nothing to add
    return extra


def _add_memory_limit(model, costed, s, e, budget, checkpoint=None):
    """The two peaks of ``cost/memory.py``, each within the budget (coefficients in GiB)."""
    for terms, constant in _memory_rows(costed, s, e, checkpoint):
        model.row(terms, upper=budget / 2**30 - constant / 2**30)


def _memory_rows(costed, s, e, checkpoint=None) -> list[tuple[list, float]]:
    """Per memory row of ``cost/memory.py``: its terms (GiB) and its constant part (bytes).
    Where the backward starts and at the forward's heaviest move, less what checkpointing
    frees (``checkpoint``); the forward's row only where the model has such a move."""
    rows = []
    for row, grid_of in (("memory_bytes", _kept), ("end_bytes", None), ("forward_bytes", _forward)):
        if row == "forward_bytes" and not any(cost.forward_bytes for cost in costed.nodes.values()):
            continue
        folds = _grid_folds(costed, s, grid_of) if grid_of else None
        terms: list = []
        constant = 0.0
        for name, cost in costed.nodes.items():
            per = getattr(cost, row)
            if not per:
                continue
            if folds:
                per = [b + f for b, f in zip(per, folds[name])]
            if isinstance(s[name], int):
                constant += per[s[name]]
            else:
                terms.extend((var, b / 2**30) for var, b in zip(s[name], per) if b)
        if grid_of:
            for key, grid in e.items():
                held = grid_of(costed.edges[key])
                if held:
                    terms.extend((grid[r][c], b / 2**30) for r, cells in enumerate(held) for c, b in enumerate(cells) if b)
            if checkpoint is not None:
                terms.extend(checkpoint.freed_gib)
                constant += checkpoint.freed_constant_bytes
        rows.append((terms, constant))
    return rows


def _kept(edge):
    return edge.kept_bytes


def _forward(edge):
    return edge.forward_bytes


def _rerun(edge):
    return edge.rerun_seconds


def _grid_folds(costed, s, grid_of) -> dict[str, list[float]]:
    """Per decision, the bytes of each strategy from edges without variables (``grid_of``:
    an edge's bytes grid), folded into the end that decides them as ``_edge_folds`` folds
    their seconds."""
    extra = {name: [0.0] * len(cost.compute_s) for name, cost in costed.nodes.items()}
    for (u, v, _), edge in costed.edges.items():
        grid = grid_of(edge)
        if not grid or not _folded(edge, s[u], s[v]):
            continue
        folded = _by_one_end(edge, grid, s[u], s[v])
        if folded is not None:
            side, per = folded
            for i, b in enumerate(per):
                extra[v if side == "v" else u][i] += b
    return extra


def _by_one_end(edge, grid, s_u, s_v) -> tuple[str, list[float]] | None:
    """A folded edge's bytes (``grid``) as a function of the end that decides them: ("v", per
    strategy of v) where the producer's side is fixed, else ("u", per strategy of u) where
    the consumer's is; None for an edge that costs no time (it moves nothing, and keeps nothing)."""
    fixed_row = 0 if len(edge.rows) == 1 else edge.row_of[s_u] if isinstance(s_u, int) else None
    if fixed_row is not None:
        return "v", [grid[fixed_row][col] for col in edge.col_of]
    fixed_col = 0 if len(edge.cols) == 1 else edge.col_of[s_v] if isinstance(s_v, int) else None
    if fixed_col is not None:
        return "u", [grid[row][fixed_col] for row in edge.row_of]
    return None


def _sharded_outputs(costed, name: str, index: int) -> int:
    """Tie-break units of a strategy: an op's non-replicated output placements; a batch
    input's replicated ones (a batch that is as cheap split as whole should arrive split);
    nothing for parameters."""
    decision = costed.choices.decision(name)
    outputs = decision.strategies[index].outputs
    if decision.kind == INPUT:
        return sum(p == "R" for spec in outputs if spec for p in spec)
    if decision.kind != OP:
        return 0
    return sum(p != "R" for spec in outputs if spec for p in spec)


def _objective(costed, s, e) -> tuple[list, float]:
    """The objective's terms (nanoseconds) and its constant part."""
    terms: list = []
    constant = 0.0
    folds = _edge_folds(costed, s)
    for name, cost in costed.nodes.items():
        per = [
            round((c + m) * NS) + _sharded_outputs(costed, name, i) * TIE_BREAK_NS + folds[name][i]
            for i, (c, m) in enumerate(zip(cost.compute_s, cost.comm_s))
        ]
        if isinstance(s[name], int):
            constant += per[s[name]]
        else:
            terms.extend((var, p) for var, p in zip(s[name], per) if p)
    for key, grid in e.items():
        for r, row in enumerate(costed.edges[key].seconds):
            terms.extend((grid[r][c], round(t * NS)) for c, t in enumerate(row) if round(t * NS))
    return terms, constant
