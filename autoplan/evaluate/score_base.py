"""What every way of scoring a plan shares (``score.py``, ``score_microbatched.py``): the
``Score`` it returns, the check that the plan was made for the model (parameters, batch
shapes, modules, fingerprint), the layouts a plan fixes as pins, and the profile it is
priced with."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoplan.cost.profile import ClusterProfile, load_profile
from autoplan.errors import PlanError, ProfileError
from autoplan.explain.show import peak_memory_lines
from autoplan.pipeline.budget import MemoryBudget, budget_words
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import ModelTrace, Problem, trace_for_planning
from autoplan.plan.module_plan import Plan
from autoplan.trace.repeats import find_repeated_blocks, laid_out_alike
from autoplan.trace.tracer import trace_model
from autoplan.tree_paths import readable_path


@dataclass(frozen=True)
class Score:
    """What one step of a plan costs, predicted by one cluster profile."""

    step_time_s: float
    """Compute plus communication, seconds (no overlap assumed)."""
    compute_s: float
    comm_s: float
    peak_memory_bytes: int
    """Per device: model state plus activations kept for backward."""
    model_state_bytes: int
    activation_bytes: int
    fits: bool
    """Whether the peak fits the per-device memory budget."""
    budget_bytes: float
    """The budget judged against: the one given, else the plan's own, else the profile's device memory."""
    profile: str
    pinned_values: int
    """Parameters and batch inputs pinned."""
    pinned_boundaries: int
    """Module boundary layouts pinned."""
    skipped_boundaries: tuple[str, ...]
    """Module boundary layouts that could not be pinned (see the module docstring)."""
    plan: Plan
    """The scored plan as re-solved: same layout, its prediction under ``profile``."""
    budget: MemoryBudget | None = None
    """``budget_bytes`` as given (its unit) and where it comes from."""

    def summary(self) -> str:
        mesh = "x".join(map(str, self.plan.mesh_shape))
        lines = [
            f"mesh {mesh} ({', '.join(self.plan.axis_names)}), profile {self.profile}",
            (f"predicted step time {self.step_time_s * 1e3:.3f} ms "
            f"(compute {self.compute_s * 1e3:.3f} ms, communication {self.comm_s * 1e3:.3f} ms)"),
            *peak_memory_lines(self.plan),
            ("fits" if self.fits else "does NOT fit") + f" the per-device budget of {budget_words(self.budget_bytes, self.budget)}",
            f"pinned {self.pinned_values} parameters and batch inputs, {self.pinned_boundaries} module boundary layouts"
            + (f" ({len(self.skipped_boundaries)} could not be pinned)" if self.skipped_boundaries else ""),
        ]
        lines.extend(f"not pinned: {what}" for what in self.skipped_boundaries)
        return "\n".join(lines)


def check_plan_for_model(
    model: nn.Module, example_inputs, plan: Plan, loss_fn=None, command: str = "score"
) -> tuple[ModelTrace, set[str]]:
    """Trace ``model`` (with ``loss_fn``'s loss) and check that ``plan`` was made for it
    (parameters, batch shapes, modules, model fingerprint, a tied plan's included); returns
    the trace to score the plan on (see the module docstring) and the fingerprints
    accepted. A mismatch is a PlanError naming it, whose fix names ``command`` (what the
    user is running: "score", "verify", "explain", "report")."""
    whole = ModelTrace(trace_model(model, example_inputs, loss_fn), None)
    planned = whole
    if plan.fingerprint != whole.fingerprint and find_repeated_blocks(model) is not None:
        tied = trace_for_planning(model, example_inputs, loss_fn=loss_fn)
        if tied.blocks is not None and plan.fingerprint == tied.fingerprint:
            planned = tied
    accepted = {whole.fingerprint, planned.fingerprint}
    check_model(whole, plan, accepted, command)
    if not laid_out_alike(planned.blocks, plan.parameters, plan.modules):
        planned = whole  # a layer laid out unlike the others: tying cannot express it
    return planned, accepted


def pins_for_plan(problem: Problem, plan: Plan) -> tuple[Pins, int, int]:
    """What a plan fixes: its parameter, batch and module boundary layouts, as pins
    (with the number of values and of boundaries pinned); the solver places the rest."""
    pins = Pins(problem)
    values = 0
    for fqn, spec in sorted(plan.parameters.items()):
        pins.place(fqn, spec, f"parameter {fqn}")
        values += 1
    for key, batch in sorted(plan.inputs.items()):
        pins.place(key, batch.placements, f"batch input {readable_path(key)}")
        values += 1
    boundaries, _ = pins.module_boundaries(plan.modules)
    return pins, values, boundaries


def plan_profile(plan: Plan, profile) -> ClusterProfile:
    """The profile to price ``plan`` with: ``profile`` (a name, a path or a ClusterProfile), else the one the plan was made with."""
    if isinstance(profile, ClusterProfile):
        return profile
    if profile is not None:
        return load_profile(profile)
    try:
        return load_profile(plan.profile)
    except ProfileError as err:
        raise ProfileError(
            f"the plan was made with profile {plan.profile!r}, which is not a built-in profile",
            hint="pass the profile to score with (--profile NAME|FILE)",
        ) from err


def check_mesh(plan: Plan, mesh) -> None:
    if mesh is not None and tuple(int(n) for n in mesh) != tuple(plan.mesh_shape):
        raise PlanError(
            f"the plan is for a {'x'.join(map(str, plan.mesh_shape))} mesh, got {'x'.join(map(str, mesh))}",
            hint="score the plan on its own mesh, or re-plan for this mesh with `autoplan suggest --mesh`",
        )


def check_model(trace: ModelTrace, plan: Plan, accepted: set[str], command: str = "score") -> None:
    traced = trace.traced
    names = trace.parameter_names()
    unknown = sorted(set(plan.parameters) - names)
    missing = sorted(names - set(plan.parameters))
    if unknown or missing:
        what = f"plan parameters not in the model: {unknown[:3]}" if unknown else f"model parameters missing from the plan: {missing[:3]}"
        raise PlanError(f"the plan does not match the model ({what})",
                        hint=f"{command} the model the plan was made for, or re-plan it with `autoplan suggest`")
    keys = set(traced.inputs.values())
    if set(plan.inputs) != keys:
        raise PlanError(
            f"the plan's batch inputs {_readable(plan.inputs)} are not the model's {_readable(keys)}",
            hint="pass the example inputs the plan was made with",
        )
    for node, key in traced.inputs.items():
        shape = _shape(traced, node)
        if tuple(plan.inputs[key].shape) != shape:
            raise PlanError(
                f"batch input {readable_path(key)} has shape {list(shape)}, the plan was made for {list(plan.inputs[key].shape)}",
                hint=f"{command} with the batch shape the plan was made for, or re-plan with `autoplan suggest`",
            )
    if plan.fingerprint not in accepted:
        raise PlanError(
            f"the plan's model fingerprint {plan.fingerprint} is not this model's ({trace.fingerprint}): "
            "it was made for another model, another version of it, or another autoplan",
            hint=f"{command} the model file and builder the plan was made for, or re-plan it with `autoplan suggest`",
        )
    stray = sorted(set(plan.modules) - trace.module_names())
    if stray:
        raise PlanError(f"plan modules not in the model: {stray[:3]}", hint="re-plan this model with `autoplan suggest`")


def _readable(keys) -> str:
    return "[" + ", ".join(readable_path(key) for key in sorted(keys)) + "]"


def _shape(traced, node: str) -> tuple[int, ...]:
    for fx_node in traced.graph_module.graph.nodes:
        if fx_node.name == node:
            return tuple(fx_node.meta["val"].shape)
    raise AssertionError(f"no placeholder {node}")
