"""Stage 4: pick one strategy per decision by an integer linear program (OR-Tools MathOpt, HiGHS).

Sets: decisions V, each with strategies I_v; edges E = (u, v, k) with rows R_e (distinct
specs u can output) and columns C_e (distinct specs v can require at input k).

Variables
    s[v, i] in {0, 1}           decision v uses strategy i                (_add_strategy_vars)
    e[uvk, r, c] in [0, 1]      producer shows spec r, consumer wants c  (_add_edge_vars)

Objective (microseconds)
    min  sum_v sum_i s[v,i] * (compute[v,i] + comm[v,i])
       + sum_e sum_{r,c} e[e,r,c] * reshard[e,r,c]                       (_objective)

Constraints
    sum_i s[v,i] = 1                                   one strategy each  (_add_strategy_vars)
    sum_c e[e,r,c] = sum_{i: row(i)=r} s[u,i]          edge rows match u  (_add_edge_vars)
    sum_r e[e,r,c] = sum_{j: col(j)=c} s[v,j]          edge cols match v  (_add_edge_vars)
    sum_v sum_i s[v,i] * memory[v,i] <= budget         per-device memory  (_add_memory_limit)

The edge linking is the tight (transportation) form: with one-hot s the margins are
one-hot and e is the product s_u * s_v, so e can be continuous. Edges are aggregated
over distinct specs, not strategy pairs, which keeps them small.

HiGHS runs with a fixed seed and its default (deterministic) parallelism, so the same model
gives the same answer unless the time limit cuts the search.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from ortools.math_opt.python import mathopt

from autoplan.cost import CostedGraph
from autoplan.errors import InfeasibleError

US = 1e6  # objective unit: microseconds
TIE_BREAK_US = 1e-3
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


def solve(
    costed: CostedGraph,
    memory_budget_bytes: float,
    time_limit_s: float | None = None,
    allowed: dict[str, set[int]] | None = None,
) -> Solution:
    """Optimal strategies under the budget; ``allowed`` restricts some decisions (pinning)."""
    started = time.perf_counter()
    model = mathopt.Model(name="autoplan")
    s = _add_strategy_vars(model, costed)
    _pin(model, s, allowed or {})
    e = _add_edge_vars(model, costed, s)
    _add_memory_limit(model, costed, s, memory_budget_bytes)
    model.minimize(_objective(costed, s, e))

    params = mathopt.SolveParameters(
        random_seed=0,
        relative_gap_tolerance=1e-6,
        time_limit=datetime.timedelta(seconds=time_limit_s) if time_limit_s else None,
    )
    result = mathopt.solve(model, mathopt.SolverType.HIGHS, params=params)
    reason = result.termination.reason
    if reason in (mathopt.TerminationReason.INFEASIBLE, mathopt.TerminationReason.INFEASIBLE_OR_UNBOUNDED) or not result.has_primal_feasible_solution():
        if reason == mathopt.TerminationReason.NO_SOLUTION_FOUND:
            raise InfeasibleError(
                f"the solver found no plan within the {time_limit_s:g} s time limit",
                hint="raise --time-limit",
            )
        need = minimum_memory_bytes(costed)
        err = InfeasibleError(
            f"no plan fits {memory_budget_bytes / 2**30:.3g} GiB per device "
            f"(the smallest possible needs {need / 2**30:.3g} GiB)",
            hint="raise --memory-gb, use a mesh with more devices, or a smaller batch",
        )
        err.smallest_bytes = need
        raise err
    values = result.variable_values()
    choice = {}
    for name, variables in s.items():
        if isinstance(variables, int):
            choice[name] = variables
        else:
            choice[name] = max(range(len(variables)), key=lambda i: (values[variables[i]], -i))
    tie_break = sum(_sharded_outputs(costed, name, i) for name, i in choice.items()) * TIE_BREAK_US
    objective = (result.objective_value() - tie_break) / US
    bound = (result.best_objective_bound() - tie_break) / US if reason == mathopt.TerminationReason.FEASIBLE else objective
    gap = 0.0 if objective == 0 else max(0.0, (objective - bound) / abs(objective))
    return Solution(
        choice=choice,
        status="optimal" if reason == mathopt.TerminationReason.OPTIMAL else "feasible",
        objective_s=objective,
        bound_s=bound,
        gap=gap,
        variables=model.get_num_variables(),
        constraints=model.get_num_linear_constraints(),
        wall_s=time.perf_counter() - started,
    )


def minimum_memory_bytes(costed: CostedGraph) -> float:
    """Memory of the leanest strategy everywhere: a lower bound on any plan's peak."""
    return sum(min(cost.memory_bytes) for cost in costed.nodes.values())


def _add_strategy_vars(model, costed):
    """s[v] is a list of binaries, or the index itself when v has one strategy."""
    s = {}
    for name, cost in costed.nodes.items():
        count = len(cost.compute_s)
        if count == 1:
            s[name] = 0
            continue
        variables = [model.add_binary_variable(name=f"s[{name},{i}]") for i in range(count)]
        model.add_linear_constraint(mathopt.fast_sum(variables) == 1)
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
                model.add_linear_constraint(var == 0)


def _strategy_sum(s_v, members):
    if isinstance(s_v, int):
        return 1.0 if s_v in members else 0.0
    return mathopt.fast_sum(s_v[i] for i in members)


def _add_edge_vars(model, costed, s):
    """Edge variables, or a constant cost where both ends are fixed."""
    e = {}
    for key, edge in costed.edges.items():
        u, v, _ = key
        if len(edge.rows) == 1 and len(edge.cols) == 1:
            continue  # one spec each side: constant cost, added in _objective
        rows = [[i for i, r in enumerate(edge.row_of) if r == row] for row in range(len(edge.rows))]
        cols = [[j for j, c in enumerate(edge.col_of) if c == col] for col in range(len(edge.cols))]
        grid = [[model.add_variable(lb=0.0, ub=1.0) for _ in edge.cols] for _ in edge.rows]
        for r, members in enumerate(rows):
            model.add_linear_constraint(mathopt.fast_sum(grid[r]) == _strategy_sum(s[u], members))
        for c, members in enumerate(cols):
            model.add_linear_constraint(mathopt.fast_sum(grid[r][c] for r in range(len(rows))) == _strategy_sum(s[v], members))
        e[key] = grid
    return e


def _add_memory_limit(model, costed, s, budget):
    terms, constant = [], 0.0
    for name, cost in costed.nodes.items():
        if isinstance(s[name], int):
            constant += cost.memory_bytes[s[name]]
        else:
            terms.extend(var * (b / 2**30) for var, b in zip(s[name], cost.memory_bytes) if b)
    model.add_linear_constraint(mathopt.fast_sum(terms) <= budget / 2**30 - constant / 2**30)


def _sharded_outputs(costed, name: str, index: int) -> int:
    """Non-replicated output placements of an op's strategy (placeholders are not tie-broken:
    a batch that is as cheap split as whole should arrive split)."""
    data = costed.choices.graph.nodes[name]
    if data["kind"] != "op":
        return 0
    outputs = data["strategies"][index].outputs
    return sum(p != "R" for spec in outputs if spec for p in spec)


def _objective(costed, s, e):
    terms, constant = [], 0.0
    for name, cost in costed.nodes.items():
        per = [
            (c + m) * US + _sharded_outputs(costed, name, i) * TIE_BREAK_US
            for i, (c, m) in enumerate(zip(cost.compute_s, cost.comm_s))
        ]
        if isinstance(s[name], int):
            constant += per[s[name]]
        else:
            terms.extend(var * p for var, p in zip(s[name], per) if p)
    for key, edge in costed.edges.items():
        if key in e:
            for r, row in enumerate(edge.seconds):
                terms.extend(e[key][r][c] * (t * US) for c, t in enumerate(row) if t)
        else:
            constant += edge.seconds[0][0] * US
    return mathopt.fast_sum(terms) + constant
