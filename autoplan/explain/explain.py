"""``explain``: why a plan, against the layouts a person would try instead.

For each block of the model (``alternatives.units_of``: a repeated layer once, and each
module outside the stack that owns parameters) and each alternative layout of it
(``alternatives.alternatives_for``), that block's parameters are pinned and the solver lays
out the rest of the model: the same problem ``suggest`` and ``score`` solve
(``pipeline/problem.py``), so each figure is a step time the cost stage predicts, and an
alternative's plan scores (``autoplan score``) to exactly its time here: its solution
satisfies every pin ``score`` adds, and is the optimum of a larger problem.

Also: the plan's own score (``evaluate/score.py``'s ``score_problem``), its ten largest
communication charges with the module and tensor that cause them (the cost stage's own
per-edge and per-op charges of the plan's solution, which add up to ``comm_s``), and what
binds: the memory budget (the best plan without it is faster) or time (it is not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.estimate import output_values
from autoplan.dtensor import context_attention
from autoplan.errors import AutoplanError
from autoplan.evaluate.score import Score, check_plan_for_model, pins_for_plan, plan_profile, score_problem
from autoplan.explain.alternatives import PLAN_OWN, alternatives_for, units_of
from autoplan.explain.show import context_words
from autoplan.pipeline.budget import plans_budget
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import Problem, prepare_problem, solve_problem
from autoplan.plan.expert_parallel import expert_notes, expert_rows
from autoplan.tree_paths import readable_path

TOP = 10


@dataclass(frozen=True)
class AlternativeResult:
    unit: str
    name: str
    step_time_s: float | None
    compute_s: float | None
    comm_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    delta_s: float | None
    """Step time less the plan's own score."""
    notes: tuple[str, ...] = ()
    error: str = ""
    """Why the layout could not be pinned (an error's one line), else empty."""
    plan: object = None
    """The solved plan: the block pinned, the rest the solver's (not in ``to_dict``)."""


@dataclass(frozen=True)
class Charge:
    seconds: float
    module: str
    tensor: str
    what: str
    """The collectives in words: "all_gather on dp, reduce_scatter on dp (backward)"."""


@dataclass(frozen=True)
class Explanation:
    own: Score
    alternatives: tuple[AlternativeResult, ...]
    charges: tuple[Charge, ...]
    binds: str
    budget_bytes: float
    free_step_time_s: float
    """The best plan's step time with no memory budget."""
    block_compute_s: dict = dataclasses.field(default_factory=dict)
    """Block (``block_of``) -> the cost stage's compute seconds of the plan's solution there."""
    budget_words: str = ""
    """The budget in words: as given (its unit), in bytes, where it comes from (``pipeline/budget.py``)."""
    context: tuple[str, ...] = ()
    """The plan's context-parallel layout and the step without it, in words (``show.context_words``)."""
    experts: tuple = ()
    """The plan's expert-parallel layouts (``plan/expert_parallel.expert_rows``)."""
    expert_notes: tuple[str, ...] = ()
    """What the experts' other layout costs, where ``suggest --expert-parallel`` priced it."""

    def to_dict(self) -> dict:
        own = self.own
        return {
            "plan": {"step_time_s": own.step_time_s, "compute_s": own.compute_s, "comm_s": own.comm_s,
                     "peak_memory_bytes": own.peak_memory_bytes, "fits": own.fits},
            "alternatives": [
                {k: v for k, v in dataclasses.asdict(a).items() if k != "plan"} for a in self.alternatives
            ],
            "charges": [dataclasses.asdict(c) for c in self.charges],
            "binds": self.binds,
            "budget_bytes": self.budget_bytes,
            "free_step_time_s": self.free_step_time_s,
            "block_compute_s": self.block_compute_s,
            **({"context": list(self.context)} if self.context else {}),
        }


def explain_plan(
    model,
    example_inputs,
    plan,
    module: str | None = None,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    loss_fn=None,
    progress: Callable[[str], None] | None = None,
    command: str = "explain",
    *,
    memory_gib: float | None = None,
) -> Explanation:
    """Explain ``plan`` for ``model`` (see the module docstring); ``module`` limits the
    alternatives to that module's block. ``progress(text)`` hears what is being solved.
    ``command``: what the user runs ("explain", "report"), named in a mismatch's fix.
    The budget: ``memory_gb`` (10**9 bytes) or ``memory_gib`` (2**30 bytes), else the one
    the plan was made under, else the profile's device memory (as ``score``). A plan with a
    context axis is scored and its alternatives solved with that axis's attention rule."""
    layout = plan.context_parallel
    with context_attention.active(None if layout is None else layout.axis_index):
        found = _explain(model, example_inputs, plan, module, profile, memory_gb, time_limit_s, loss_fn, progress, command,
                         memory_gib)
    return dataclasses.replace(found, context=context_words(plan))


def _explain(model, example_inputs, plan, module, profile, memory_gb, time_limit_s, loss_fn, progress, command,
             memory_gib) -> Explanation:
    say = progress or (lambda text: None)
    units = units_of(plan, module)  # a module the plan lacks fails here, before any solve
    cluster = plan_profile(plan, profile)
    say("tracing the model")
    trace, accepted = check_plan_for_model(model, example_inputs, plan, loss_fn, command)
    say("building and costing the choices")
    problem = prepare_problem(
        model, example_inputs, plan.mesh_shape, plan.axis_names, cluster, memory_gb, memory_gib=memory_gib,
        budget=plans_budget(plan), trace=trace, loss_fn=loss_fn, progress=progress, regime=plan.regime,
    )
    say("scoring the plan")
    own = score_problem(problem, plan, time_limit_s, accepted)
    results = []
    solves = [(unit, alt) for unit in units for alt in alternatives_for(unit, plan)]
    for done, (unit, alt) in enumerate(solves):
        say(f"solving {done + 1}/{len(solves)}: {unit.name} as {alt.name}")
        results.append(_solve_alternative(problem, unit.name, alt, own, time_limit_s, problem.recompute_mode(plan)))
    say("pricing the plan's collectives")
    choice = plan_choice(problem, plan, time_limit_s)
    charges = costliest_charges(problem, choice)
    say("solving without the memory budget")
    unbounded = dataclasses.replace(problem, budget_bytes=float("inf"))
    free, _, _ = solve_problem(unbounded, Pins(unbounded), time_limit_s)
    words = problem.budget_words()
    return Explanation(own, tuple(results), charges, _binds(own, free.predicted, problem.budget_bytes, words),
                       problem.budget_bytes, free.predicted.step_time_s, block_compute(problem, choice, plan), words,
                       experts=expert_rows(plan), expert_notes=expert_notes(plan))


def plan_choice(problem: Problem, plan, time_limit_s=None) -> dict[str, int]:
    """The strategy of every traced decision in the plan's cheapest execution (as ``score``)."""
    _, solution, _ = solve_problem(problem, pins_for_plan(problem, plan)[0], time_limit_s, over_budget=True,
                                   recompute=problem.recompute_mode(plan))
    return problem.expand(solution.choice)


def block_of(module: str, plan) -> str:
    """The block a module belongs to: its stack of numbered layers folded ("model.layers.0-31"),
    else the module itself ("<root>" for ops outside every module: the loss)."""
    from autoplan.explain.alternatives import _folded

    if not module:
        return "<root>"
    import re

    match = re.search(r"\.(\d+)(?=\.|$)", module)
    return _folded(module[: match.end()], plan) if match else module


def block_compute(problem: Problem, choice: dict[str, int], plan) -> dict[str, float]:
    """Compute seconds per block: each decision's cost-stage compute in the plan's solution,
    weighted to the whole model as ``predict`` weights it (they add up to ``compute_s``)."""
    owners = problem.traced.node_modules
    out: dict[str, float] = {}
    for name, cost in problem.costed.nodes.items():
        block = block_of(owners.get(name, ""), plan)
        out[block] = out.get(block, 0.0) + cost.compute_s[choice[name]]
    return out


def _solve_alternative(problem: Problem, unit: str, alt, own: Score, time_limit_s, recompute=False) -> AlternativeResult:
    """``alt`` laid out for ``unit``, the rest solved; checkpointed as the plan is (``recompute``)."""
    pins = Pins(problem)
    try:
        for fqn, spec in sorted(alt.layout.items()):
            pins.place(fqn, spec)
        plan, _, fits = solve_problem(problem, pins, time_limit_s, [f"explain: {unit} laid out as {alt.name}"], over_budget=True,
                                      recompute=recompute)
    except AutoplanError as err:
        return AlternativeResult(unit, alt.name, None, None, None, None, False, None, alt.notes, err.problem)
    p = plan.predicted
    return AlternativeResult(
        unit, alt.name, p.step_time_s, p.compute_s, p.comm_s, p.peak_memory_bytes, fits,
        p.step_time_s - own.step_time_s, alt.notes, "", plan,
    )


def _binds(own: Score, free, budget: float, words: str) -> str:
    from autoplan.explain.show import ms, nbytes

    if not own.fits:
        return f"the plan does not fit the per-device budget of {words}: memory binds and is broken"
    gain = own.step_time_s - free.step_time_s
    if gain > 1e-4 * max(own.step_time_s, 1e-12):
        return (
            f"memory binds: without the per-device budget of {words} the best plan takes "
            f"{ms(free.step_time_s)} ms ({ms(gain)} ms faster) and needs {nbytes(free.peak_memory_bytes)}; "
            f"this plan peaks at {nbytes(own.peak_memory_bytes)}"
        )
    return (
        f"time binds: the fastest layout found fits the budget; peak {nbytes(own.peak_memory_bytes)} of "
        f"{words} ({nbytes(budget - own.peak_memory_bytes)} to spare)"
    )


def costliest_charges(problem: Problem, choice: dict[str, int], top: int = TOP) -> tuple[Charge, ...]:
    """The ``top`` largest communication charges of the plan's solution: each edge where a
    value is moved (module of its reader, the value, the collectives DTensor runs) and each
    op's gradient reductions. These are the terms ``plan/builder.predict`` sums into
    ``comm_s``, weighted like it to the whole model (a tied layer counts for all it stands for)."""
    from autoplan.cost.comm import redistribute_collectives
    from autoplan.cost.estimate import gradient_roots, splits_work

    costed, graph = problem.costed, problem.choices.graph
    traced = problem.traced
    names = problem.choices.axis_names
    mesh = tuple(problem.choices.mesh_shape)
    roots = gradient_roots(problem.choices)

    def tensor(node: str) -> str:
        return _tensor(traced, graph, node, roots)

    out_index = {(u, v, k): i for u, v, k, i in graph.reads()}
    found = []
    for (u, v, k), edge in costed.edges.items():
        row, col = edge.row_of[choice[u]], edge.col_of[choice[v]]
        seconds = edge.seconds[row][col]
        if seconds <= 0:
            continue
        src, dst = edge.rows[row], edge.cols[col]
        backward = graph.decision(u).requires_grad and graph.decision(v).requires_grad
        moves = redistribute_collectives(src, dst, 1.0, mesh, backward)
        words = ", ".join(f"{kind} on {names[axis]}" + (" (backward)" if way == "backward" else "") for kind, axis, _, way in moves)
        what = f"{_spec(src)} -> {_spec(dst)}: {words or 'moved by DTensor'}"
        found.append(Charge(seconds, _module(problem, v), _tensor(traced, graph, u, roots, out_index.get((u, v, k), 0)), what))
    for name, cost in costed.nodes.items():
        seconds = cost.comm_s[choice[name]]
        if seconds <= 0:
            continue
        # The rule the cost stage charges by: an input replicated on an axis over which the
        # op splits its work gets a partial gradient there, all-reduced.
        strategy = graph.decision(name).strategies[choice[name]]
        reduced = []
        for (u, _, k) in graph.inputs_of(name):
            axes = [names[a] for a in range(len(mesh))
                    if strategy.inputs[k][a] == "R" and splits_work(strategy, a) and graph.decision(u).requires_grad]
            if axes:
                reduced.append(f"{tensor(u)} on {', '.join(axes)}")
        target = str(graph.decision(name).fx_node.target).split(".")[1] if "." in str(graph.decision(name).fx_node.target) else name
        decision = graph.decision(name)
        inputs = [output_values(graph.decision(u))[i] for u, i, _ in graph.inputs_of(name)]
        gathers = context_attention.kv_gathers(decision.fx_node, inputs, strategy, mesh, decision.requires_grad)[0]
        if gathers:  # context parallel's attention: its keys and values gathered, their gradients scattered back
            found.append(Charge(seconds, _module(problem, name), f"keys and values of {name}",
                                ", ".join(f"{kind} on {names[axis]}" + (" (backward)" if back else "")
                                          for kind, axis, _, back in gathers)))
            continue
        found.append(Charge(seconds, _module(problem, name), "; ".join(reduced) or f"inputs of {name}",
                            f"all_reduce of the gradient ({target} splits its work over a replicated input)"))
    found.sort(key=lambda c: -c.seconds)
    return tuple(found[:top])


def _spec(spec) -> str:
    from autoplan.placements import format_spec

    return format_spec(tuple(spec))


def _module(problem: Problem, node: str) -> str:
    owner = problem.traced.node_modules.get(node, "") or "<root>"
    blocks = problem.blocks
    if blocks is not None and blocks.layer_of(owner) == 1 and blocks.count > 2:
        return blocks.rename(owner, 1).replace(f"{blocks.fqn}.1", f"{blocks.fqn}.1-{blocks.count - 1}", 1)
    return owner


def _tensor(traced, graph, node: str, roots: dict, index: int = 0) -> str:
    """A value in words: a parameter's FQN or a batch key (through views of them), else the
    traced node, its shape and the module that made it."""
    root = roots.get(node, node)
    via = f" (as {node})" if root != node else ""
    if root in traced.parameters:
        return traced.parameters[root][0] + via
    if root in traced.inputs:
        return f"batch {readable_path(traced.inputs[root])}{via}"
    from autoplan.cost.estimate import output_values

    values = output_values(graph.decision(node))  # a split makes several: the one read
    value = values[index] if index < len(values) else None
    shape = list(getattr(value, "shape", ())) if value is not None else []
    owner = traced.node_modules.get(node, "") or "<root>"
    name = f"{node}[{index}]" if len(values) > 1 else node
    return f"{name} {shape} (made in {owner})"


def explain_sections(e: Explanation) -> list:
    """The explanation as tables (``render.py``)."""
    from autoplan.explain.render import Section
    from autoplan.explain.show import ms, nbytes

    own = e.own
    sections = [Section(
        f"the plan: {ms(own.step_time_s)} ms per step (compute {ms(own.compute_s)}, communication "
        f"{ms(own.comm_s)}), peak {nbytes(own.peak_memory_bytes)} per device, budget {e.budget_words or nbytes(e.budget_bytes)}",
    )]
    rows = []
    for a in e.alternatives:
        if a.error:
            rows.append((a.unit, a.name, "-", "-", "-", "-", "-", f"cannot be pinned: {a.error}"))
            continue
        assert a.delta_s is not None  # an alternative that could be pinned was priced
        delta = "0 (the plan)" if a.name.startswith(PLAN_OWN) and abs(a.delta_s) < 5e-7 else f"{a.delta_s * 1e3:+.3f}"
        rows.append((
            a.unit, a.name, ms(a.step_time_s), delta, ms(a.compute_s), ms(a.comm_s),
            nbytes(a.peak_memory_bytes), "yes" if a.fits else "NO",
        ))
    notes = tuple(dict.fromkeys(f"{a.unit}, {a.name}: {n}" for a in e.alternatives for n in a.notes[:2]))
    sections.append(Section(
        "alternatives per block (that block pinned, the rest of the model solved; ms per step)",
        ("block", "layout", "step ms", "vs plan ms", "compute", "comm", "peak memory", "fits"),
        tuple(rows),
        notes=notes[:6],
        right=(2, 3, 4, 5, 6),
    ))
    sections.append(Section(
        f"largest communication charges of the plan (top {len(e.charges)}, of {ms(own.comm_s)} ms)",
        ("ms", "module", "tensor", "collectives"),
        tuple((ms(c.seconds), c.module, c.tensor, c.what) for c in e.charges),
        right=(0,),
    ))
    sections.append(Section("what binds", notes=(e.binds,)))
    if e.context:
        sections.append(Section("context parallel (the sequence split over a mesh axis)", notes=e.context))
    if e.experts or e.expert_notes:
        from autoplan.explain.show import expert_section

        note = ("the alternatives and charges above price the experts' weights where DTensor would lay them out, "
                "not expert parallel") if e.experts else ""
        sections.append(expert_section(e.experts, (*e.expert_notes, *([note] if note else []))))
    return sections
