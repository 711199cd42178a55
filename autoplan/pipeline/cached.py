"""``autoplan.suggest``: the planning run with the plan cache, and on every rank of a job.

``suggest_cached`` traces the model as planning would (the cache key needs its fingerprint), returns the
cached plan when there is one, and otherwise runs the pipeline on that trace and stores
the plan. ``suggest_on_every_rank`` runs that on rank 0 and hands every rank rank 0's
plan bytes (``rank_sync``), so a training script can call ``autoplan.suggest`` on every
rank and the ranks agree by construction. ``suggest`` is the public entry point over both.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass

from torch import nn

from autoplan.cost.regime import DEFAULT_REGIME, check_regime
from autoplan.pipeline.arguments import check_mesh, check_model, check_positive
from autoplan.pipeline.budget import given_budget
from autoplan.pipeline.plan_cache import PlanCache, make_cache_key
from autoplan.pipeline.problem import resolve_options, trace_for_planning
from autoplan.pipeline.rank_sync import is_distributed, run_on_rank_zero
from autoplan.pipeline.suggest import SuggestReport, suggest_with_report
from autoplan.plan.module_plan import Plan
from autoplan.trace.loss import check_loss_fn

log = logging.getLogger("autoplan")

HIT, MISS, REPLACED, OFF, NOT_STORED = "hit", "miss", "replaced", "off", "not stored"
"""Cache outcomes: reused; planned and stored; a bad entry planned again and replaced; cache
not used; planned, and the cache could not be written (warned)."""


@dataclass(frozen=True, slots=True)
class SharedPlan:
    plan: Plan
    cache: str
    """One of HIT, MISS, REPLACED, OFF (rank 0's outcome, on every rank)."""
    cache_path: str | None
    """The cache entry rank 0 read or wrote."""


def suggest_cached(
    model,
    example_inputs,
    mesh,
    axis_names=None,
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    pinned=None,
    cache_dir=None,
    tie: bool = True,
    loss_fn=None,
    progress=None,
    recompute: bool = True,
    *,
    memory_gib: float | None = None,
    compile: str = DEFAULT_REGIME,  # the command line's --compile
    expert_parallel: bool = False,
) -> tuple[Plan, SuggestReport]:
    """``suggest_with_report`` that reuses the cached plan when the question is unchanged.

    ``report.extra`` has ``cache`` (HIT, MISS or REPLACED) and ``cache_path``. On a hit
    the report's sizes are the planning run's and its stage times are this run's (trace
    and cache lookup); no choice, cost or solve stage runs.
    """
    mesh, axis_names, cluster, budget = resolve_options(mesh, axis_names, profile, memory_gb, memory_gib)
    start = time.perf_counter()
    if progress is not None:
        progress("tracing the model")
    trace = trace_for_planning(model, example_inputs, tie, loss_fn)
    trace_s = time.perf_counter() - start
    check_regime(compile)
    key = make_cache_key(trace, mesh, axis_names, cluster, budget.bytes, time_limit_s, pinned, recompute, compile,
                         expert_parallel)
    store = PlanCache(cache_dir)
    existed = _exists(store.path(key))
    start = time.perf_counter()
    cached = store.lookup(key)
    if cached is not None:
        sizes = cached.report
        report = SuggestReport(
            plan=cached.plan,
            stage_seconds={"trace": trace_s, "cache lookup": time.perf_counter() - start},
            graph_nodes=int(sizes.get("graph_nodes", 0)),
            decisions=int(sizes.get("decisions", 0)),
            decisions_after_merge=int(sizes.get("decisions_after_merge", 0)),
            variables=int(sizes.get("variables", 0)),
            constraints=int(sizes.get("constraints", 0)),
            extra={"cache": HIT, "cache_path": str(cached.path), "planned_stage_seconds": sizes.get("stage_seconds", {}),
                   "one_device_s": _seconds(sizes.get("one_device_s"))},
            budget=budget.describe(),
        )
        return cached.plan, report
    plan, report = suggest_with_report(
        model, example_inputs, mesh, axis_names, cluster, None, time_limit_s, pinned, tie=tie, trace=trace,
        loss_fn=loss_fn, progress=progress, recompute=recompute, budget=budget, compile=compile,
        expert_parallel=expert_parallel,
    )
    stages = {"trace": trace_s, **report.stage_seconds}
    if plan.fingerprint != trace.fingerprint:
        # The whole model was traced and planned untied (the two traced layers differed, or
        # the pins lay them out differently): the key, made from the cut trace, does not
        # name this plan's model. Not stored.
        log.info("autoplan.suggest: identical-looking layers planned untied; the plan is not cached")
        return plan, dataclasses.replace(report, stage_seconds=stages, extra={**report.extra, "cache": OFF, "cache_path": None})
    path = store.store(key, plan, {
        "graph_nodes": report.graph_nodes, "decisions": report.decisions,
        "decisions_after_merge": report.decisions_after_merge, "variables": report.variables,
        "constraints": report.constraints, "stage_seconds": stages, "one_device_s": report.extra.get("one_device_s"),
    })
    outcome = NOT_STORED if path is None else REPLACED if existed else MISS
    extra = {**report.extra, "cache": outcome, "cache_path": None if path is None else str(path)}
    return plan, dataclasses.replace(report, stage_seconds=stages, extra=extra)


def _seconds(value) -> float | None:
    """A time the cache entry's report recorded, or None (entries made before it did, or a
    value that is not a finite positive number)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return None


def _exists(path) -> bool:
    try:
        return path.exists()
    except OSError:  # an unreadable cache directory: lookup warns about it
        return False


def suggest(
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=("dp", "tp"),
    profile=None,
    memory_gb: float | None = None,
    time_limit_s: float | None = None,
    *,
    cache: bool = True,
    cache_dir=None,
    broadcast: bool = True,
    tie: bool = True,
    loss_fn=None,
    recompute: bool = True,
    memory_gib: float | None = None,
    compile: str = DEFAULT_REGIME,  # the command line's --compile
    devices: int | None = None,
    devices_per_node: int | None = None,
    expert_parallel: bool = False,
) -> Plan:
    """Plan ``model`` (built on any device, meta included) for a device mesh; see docs/training.md.

    ``cache``: reuse the plan ``plans_out/cache/`` holds for the same model, mesh,
    profile and options (``cache_dir`` moves it; ``cache=False`` always solves).
    ``broadcast``: under an initialized process group every rank must call this; rank 0
    plans and every rank returns rank 0's plan. Pass False to plan on one rank alone.
    ``tie``: plan a stack of identical layers once (see ``suggest_with_report``).
    ``loss_fn(output, batch)``: the training loss to plan for, as a model file's
    ``compute_loss`` (default: ``output.loss``, ``output["loss"]`` or the one scalar the
    model returns; else the sum of its output, which the plan's warnings say).
    ``recompute``: the solver may checkpoint the repeated layers (``Plan.recompute``).
    ``memory_gb`` / ``memory_gib``: the per-device budget in GB (10**9 bytes) or in GiB
    (2**30 bytes), one or neither (default: the profile's device memory).
    ``compile``: how the step will run, priced as such (docs/compile.md): "none" (eager
    DTensor, the default), "block" (each repeated block under ``torch.compile``, as
    torchtitan compiles) or "whole"; the plan records it.
    ``devices`` (instead of ``mesh``): the mesh shape is chosen too, among every pp x dp x tp
    of that many devices (tp within a node of ``devices_per_node``, default the profile's);
    an axis named "pp" in ``axis_names`` is a pipeline axis (docs/pipeline.md). Either
    plans pipeline stages, without the plan cache; ``autoplan.pipeline_parallel.planner``'s
    ``suggest_devices`` also returns what every other mesh shape would cost.
    ``expert_parallel``: also plan with each experts module's layout a decision of the
    solver (split over a mesh axis that divides them, or whole), and keep the cheaper of
    that plan and the plan without it (docs/expert-parallel.md).
    """
    check_model(model, example_inputs)
    check_regime(compile)
    check_loss_fn(loss_fn)
    if devices is not None or (isinstance(axis_names, (tuple, list)) and "pp" in axis_names):
        return _suggest_pipelined(model, example_inputs, mesh, axis_names, devices, devices_per_node, broadcast,
                                  dict(profile=profile, memory_gb=memory_gb, memory_gib=memory_gib, loss_fn=loss_fn,
                                       compile=compile, time_limit_s=time_limit_s))
    mesh = check_mesh(mesh)
    check_positive("time_limit_s", time_limit_s)
    if isinstance(axis_names, tuple) and len(axis_names) != len(mesh) and axis_names == ("dp", "tp"):
        axis_names = None  # the default names suit 2-D meshes only
    given_budget(memory_gb, memory_gib)  # both, or a bad value: refused here, on every rank
    options = dict(profile=profile, memory_gb=memory_gb, memory_gib=memory_gib, time_limit_s=time_limit_s, tie=tie,
                   loss_fn=loss_fn, recompute=recompute, compile=compile,
                   **({"expert_parallel": True} if expert_parallel else {}))
    return suggest_on_every_rank(model, example_inputs, mesh, axis_names, options, cache, cache_dir, broadcast).plan


def _suggest_pipelined(model, example_inputs, mesh, axis_names, devices, devices_per_node, broadcast: bool,
                       options: dict) -> Plan:
    """``autoplan.suggest`` with pipeline stages (``pipeline_parallel/planner.py``), on rank 0 of a job."""
    from autoplan.pipeline_parallel.planner import suggest_devices, suggest_pipelined

    def produce() -> str:
        if devices is not None:
            plan, _ = suggest_devices(model, example_inputs, devices, devices_per_node, **options)
        else:
            plan, _ = suggest_pipelined(model, example_inputs, check_mesh(mesh), tuple(axis_names), **options)
        return plan.to_json()

    shared = broadcast and is_distributed()
    text = run_on_rank_zero(produce) if shared else produce()
    return Plan.from_dict(json.loads(text), source="rank 0's plan" if shared else "<suggest>")


def suggest_on_every_rank(model, example_inputs, mesh, axis_names, options: dict, cache: bool, cache_dir, broadcast: bool) -> SharedPlan:
    """The plan rank 0 makes (or finds in its cache), on every rank; see ``autoplan.suggest``."""

    def produce() -> str:
        if cache:
            plan, report = suggest_cached(model, example_inputs, mesh, axis_names, cache_dir=cache_dir, **options)
        else:
            plan, report = suggest_with_report(model, example_inputs, mesh, axis_names, **options)
        extra = report.extra
        return json.dumps({"plan": plan.to_json(), "cache": extra.get("cache", OFF), "cache_path": extra.get("cache_path")})

    shared = broadcast and is_distributed()
    message = json.loads(run_on_rank_zero(produce) if shared else produce())
    plan = Plan.from_dict(json.loads(message["plan"]), source="rank 0's plan" if shared else "<suggest>")
    result = SharedPlan(plan, message["cache"], message["cache_path"])
    where = "rank 0's " if shared else "the "
    what = {HIT: "reused", MISS: "solved and stored", REPLACED: "solved again, replacing a bad entry,", NOT_STORED: "solved, not stored"}
    if result.cache in what:
        log.info("autoplan.suggest: plan %s in %splan cache %s", what[result.cache], where, result.cache_path,
                 extra={"autoplan_cache": result.cache, "autoplan_cache_path": result.cache_path})
    else:
        log.info("autoplan.suggest: plan solved without the cache", extra={"autoplan_cache": OFF, "autoplan_cache_path": None})
    return result
