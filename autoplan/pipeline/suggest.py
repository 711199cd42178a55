"""One planning run with a report: ``prepare_problem`` -> ``solve_problem``, timed per stage.

The public ``autoplan.suggest`` (``cached.py``) puts the plan cache and the rank-0
broadcast around this; ``score`` and the baselines solve the same ``Problem``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from autoplan.cost.regime import DEFAULT_REGIME, check_regime
from autoplan.explain.mesh_gain import one_device_seconds
from autoplan.explain.show import peak_memory_lines
from autoplan.pipeline.expert_choice import choose_expert_layout, has_routed_experts, keep_expert_choice
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import ModelTrace, Problem, prepare_problem, solve_problem
from autoplan.placements import Spec, format_spec
from autoplan.plan.module_plan import Plan
from autoplan.trace.repeats import KEPT_LAYERS, find_repeated_blocks, laid_out_alike
from autoplan.tree_paths import readable_path


@dataclass(frozen=True)
class SuggestReport:
    """What a run did and how long each stage took (kept out of the plan file)."""

    plan: Plan
    stage_seconds: dict[str, float]
    graph_nodes: int
    decisions: int
    decisions_after_merge: int
    variables: int
    constraints: int
    model_name: str = ""
    extra: dict = field(default_factory=dict)
    budget: str = ""
    """The memory budget planned for, in words: as given (its unit), in bytes, where it comes from."""

    def stats(self) -> dict:
        """The run's numbers (stage seconds, graph and ILP sizes, solver outcome) as plain data."""
        s = self.plan.solver
        return {
            "stage_seconds": {k: round(v, 4) for k, v in self.stage_seconds.items()},
            "graph_nodes": self.graph_nodes,
            "decisions": self.decisions,
            "decisions_after_merge": self.decisions_after_merge,
            "variables": self.variables,
            "constraints": self.constraints,
            "solver": {"status": s.status, "objective_s": s.objective, "bound_s": s.bound, "gap": s.gap},
            "step_time_s": self.plan.predicted.step_time_s,
            "peak_memory_bytes": self.plan.predicted.peak_memory_bytes,
            **self.extra,
        }

    def render(self, stream, verbose: bool = False) -> None:
        """What ``autoplan suggest`` prints: how the run went, then the plan as ``autoplan
        show`` tells it (layout in words, repeated blocks folded, time, memory, MFU; and
        when the mesh gains nothing, why). ``verbose`` adds every parameter's placements
        first (``summary``)."""
        from autoplan.explain.render import render
        from autoplan.explain.show import show_sections, summarize

        stream.write((self.summary() if verbose else "\n".join(self.run_lines())) + "\n\n")
        sections = show_sections(summarize(self.plan, one_device_s=self.extra.get("one_device_s")))
        if verbose:  # the full listing above has the warnings already
            sections = [s for s in sections if s.title != "warnings"]
        render(sections, stream)

    def run_lines(self) -> list[str]:
        """The solver's outcome, graph and ILP sizes and stage times, one line each."""
        s = self.plan.solver
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in self.stage_seconds.items())
        lines = [
            (f"solver {s.status}, gap {s.gap:.2%}; {self.graph_nodes} graph nodes, {self.decisions} decisions "
            f"({self.decisions_after_merge} after merging followers), {self.variables} ILP variables"),
            f"time: {stages}",
        ]
        if self.budget:
            lines.append(f"memory budget per device: {self.budget}")
        if "tied" in self.extra:
            lines.append(f"identical layers planned alike: {self.extra['tied']}; solver status and gap are those of the tied problem")
        return lines

    def summary(self) -> str:
        plan = self.plan
        p = plan.predicted
        mesh = "x".join(map(str, plan.mesh_shape))
        lines = [f"mesh {mesh} ({', '.join(plan.axis_names)}), profile {plan.profile}"]
        lines.append("parameters (placement per mesh axis):")
        width = max((len(f) for f in plan.parameters), default=0)
        for fqn, spec in plan.parameters.items():
            lines.append(f"  {fqn:<{width}}  {format_spec(spec)}")
        lines.append("batch:")
        for key, batch in plan.inputs.items():
            lines.append(f"  {readable_path(key)}  shape {list(batch.shape)}  {format_spec(batch.placements)}")
        lines.append(
            f"predicted step time {p.step_time_s * 1e3:.3f} ms "
            f"(compute {p.compute_s * 1e3:.3f} ms, communication {p.comm_s * 1e3:.3f} ms)"
        )
        lines.extend(peak_memory_lines(plan))
        lines.extend(self.run_lines())
        for warning in plan.warnings:
            lines.append(f"warning: {warning}")
        return "\n".join(lines)


def suggest_with_report(
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=None,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    pinned: dict[str, Spec] | None = None,
    tie: bool = True,
    trace: ModelTrace | None = None,
    loss_fn=None,
    progress=None,
    recompute: bool = True,
    *,
    memory_gib: float | None = None,
    budget=None,
    compile: str = DEFAULT_REGIME,  # the command line's --compile
    problem: Problem | None = None,
    expert_parallel: bool = False,
) -> tuple[Plan, SuggestReport]:
    """Plan ``model`` for ``mesh``; ``pinned`` fixes parameter FQNs / batch keys to given specs.

    With ``tie``, a stack of identical layers is traced two layers deep and planned as one
    layer repeated (``pipeline/problem.py``); the plan still names every layer. Pins that
    lay out those layers differently are planned untied: tying would lay them all out alike.
    ``trace`` is ``trace_for_planning``'s result when the caller already has it (the plan
    cache does); it must have been made with the same ``tie`` and ``loss_fn``.
    ``loss_fn(output, batch)`` is the training loss (default: the model's own, ``trace/loss.py``).
    ``progress(text)`` hears each stage as it starts. ``recompute``: the solver may
    checkpoint the repeated layers (``solve/recompute.py``). The budget: ``memory_gb``
    (10**9 bytes) or ``memory_gib`` (2**30 bytes), else ``budget`` (a ``MemoryBudget``
    already resolved), else the profile's device memory. ``compile``: the regime the step
    runs in, priced as such: "none" (eager), "block" (each repeated block under
    ``torch.compile``) or "whole" (``cost/regime.py``). ``problem``: ``prepare_problem``'s
    result for this model and batch when the caller has it (plans at several budgets:
    ``problem.at_budget``); the options it was prepared with hold, those given here are not read.
    """
    check_regime(compile)
    pinned = {name: tuple(spec) for name, spec in (pinned or {}).items()}
    if tie and pinned and not laid_out_alike(find_repeated_blocks(model), pinned):
        tie, trace, problem = False, None, None
    if problem is None:
        problem = prepare_problem(
            model, example_inputs, mesh, axis_names, profile, memory_gb, memory_gib=memory_gib, budget=budget, tie=tie,
            trace=trace, loss_fn=loss_fn, progress=progress, regime=compile,
        )

    def solved(problem: Problem):
        pins = Pins(problem)
        for name, spec in pinned.items():
            pins.place(name, spec)
        seconds = dict(problem.stage_seconds)
        plan, solution, _ = solve_problem(problem, pins, time_limit_s, seconds=seconds, progress=progress,
                                          recompute=recompute, reprice=True)
        return plan, solution, seconds

    if expert_parallel and has_routed_experts(model):
        # The experts' layout a decision of the solver, expert parallel included, against the plan without it.
        regions = prepare_problem(
            model, example_inputs, mesh, axis_names, profile, memory_gb, memory_gib=memory_gib, budget=budget,
            tie=tie, loss_fn=loss_fn, progress=progress, regime=compile, expert_regions=True,
        )
        problem, (plan, solution, stage_seconds) = keep_expert_choice(problem, regions, solved)
    else:
        plan, solution, stage_seconds = solved(problem)
        if expert_parallel:  # grouped experts (torchtitan's): priced against the solved plan
            plan = choose_expert_layout(problem, plan, progress)
    blocks = problem.blocks
    report = SuggestReport(
        plan=plan,
        stage_seconds=stage_seconds,
        graph_nodes=len(problem.traced.graph_module.graph.nodes),
        decisions=problem.choices.graph.number_of_nodes(),
        decisions_after_merge=len(problem.reduced.nodes),
        variables=solution.variables,
        constraints=solution.constraints,
        budget=problem.budget_words(),
        extra={
            "one_device_s": one_device_seconds(problem.costed),
            "ilp_objective_s": solution.objective_s,  # the ILP's own price of the plan kept (repricing.py)
            "search_s": solution.search_s,
            "search_cpu_s": solution.search_cpu_s,
            "stopped_by_time_limit": solution.stopped_by_time_limit,
        } | (
            {"tied": f"{blocks.count} x {blocks.layer_class} at {blocks.fqn} ({KEPT_LAYERS} traced)"} if blocks else {}
        ),
    )
    return plan, report
