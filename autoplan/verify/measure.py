"""Measured step time of plans: forward, backward and an AdamW step on gloo processes.

For each job (a model file, its builder and a plan) every rank builds the model with the
same seed, applies the plan, takes its slice of the same global batch and runs training
steps: ``loss.backward()``, ``AdamW.step()``, ``zero_grad()``. After a few warm-up steps
it runs timed steps, each started on every rank together after a barrier, and stamps the
start and end of each with the host's monotonic clock, which all processes on one host
share. A step lasts from the first rank's start to the last rank's end: the barrier's own
latency is not in it, and ranks of a plan with few collectives cannot drift apart (left
free-running, 8 ranks on 2 cores finish their steps at very different times, and the
per-step gaps swing by 10x). The result is the median over the timed steps.

The number of timed steps adapts to the plan: after the warm-up every rank knows the
slowest rank's last warm-up step (one all_reduce), and runs ``min(steps, budget / that)``
steps, at least ``min_steps``, the same count everywhere.

On a shared host other programs take CPU from the ranks and slow every step. The share
of the host's CPU time that did not go to the ranks while they ran their timed steps is
read from ``/proc/stat`` and ``/proc/self/stat`` (Linux; hypervisor steal counts as
taken); a run disturbed beyond ``max_foreign_share`` is redone after a pause, up to
``retries`` times, and the least disturbed run is kept and its share reported.

After timing, one more step runs under a dispatch mode that counts the ops it dispatches
(a DTensor op counts once, not the local ops inside it): the framework's share of a step
is about that count times the per-op time of the ``OP_OVERHEAD_PROBE`` job.

All jobs run in one launch of ``world`` processes on 127.0.0.1 with one intra-op thread
each (as torchrun sets), the pattern of ``numerics.check_numerics``; jobs on the same mesh
shape share one DeviceMesh (each new one would add two gloo groups and six threads per
rank, which slowed later jobs measurably in a 76-job launch). A job that raises
on every rank alike (a layout DTensor cannot run) is reported as failed and the launch
goes on; a job that fails on some ranks only leaves the others in a collective until the
process-group timeout ends the launch, and a launch that dies is started again (the
job it died on is tried once more: another program on the host may have been the cause).
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan._process_group import free_port, process_group

COLLECTIVE_TIMEOUT_S = 120
"""A collective that waits this long means a rank is lost: the launch ends."""
LAUNCH_RETRIES = 1
"""Launches that may die on one job before it is reported as failed."""
_NOISY_LOGGERS = ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor._redistribute")


@dataclass(frozen=True)
class MeasureJob:
    model_file: str
    """A model file, or OP_OVERHEAD_PROBE for the per-op probe (see ``_probe_step``)."""
    builder: str
    plan_json: str
    label: str = ""
    compile: str = "none"
    """The regime the step runs in: "none" (eager), "block" or "whole" (``verify/compiled.py``,
    inductor); the warm-up steps compile it."""


OP_OVERHEAD_PROBE = "<dtensor op overhead>"
"""A job that times tiny replicated DTensor ops on every rank at once; its times are per op."""
PROBE_OPS = 20


@dataclass(frozen=True)
class MeasureConfig:
    warmup: int = 3
    steps: int = 10
    min_steps: int = 3
    budget_s: float = 6.0
    """Timed steps stop once they would take longer than this (at least ``min_steps``)."""
    seed: int = 0
    max_foreign_share: float = 0.1
    """Timed steps during which other programs took more of the host's CPU than this are redone."""
    retries: int = 2
    """How many times a disturbed measurement is redone (the least disturbed one is kept)."""
    quiet_wait_s: float = 5.0
    """Pause before redoing a disturbed measurement."""


@dataclass(frozen=True)
class StepTimes:
    median_s: float
    """Median step time (slowest rank), NaN when the job failed."""
    steps_s: tuple[float, ...] = ()
    warmup_s: tuple[float, ...] = ()
    error: str = ""
    foreign_share: float = float("nan")
    """Share of the host's CPU time that other programs took while the kept steps ran."""
    attempts: int = 0
    """Timed runs made (more than one when other programs disturbed the first)."""
    ops: int = 0
    """Ops one step dispatches (DTensor ops and plain ones, forward, backward and optimizer)."""

    @property
    def ok(self) -> bool:
        return not self.error


def measure_step_times(jobs: list[MeasureJob], world: int, config: MeasureConfig = MeasureConfig(), progress=None) -> list[StepTimes]:
    """Time every job on ``world`` gloo processes; one result per job, in order.

    Rank 0 appends each job's result to a file as soon as it has it (also to ``progress``,
    if given, to follow a long run). If the launch dies (a rank crashes or is killed), the
    job in flight is tried once more in a new launch, then reported as failed, and a new
    launch times the jobs after it.
    """
    results: list[dict] = []
    died_on: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="autoplan-measure-") as tmp, _single_thread_env():
        done = Path(tmp) / "results.jsonl"
        while len(results) < len(jobs):
            rest = jobs[len(results):]
            done.unlink(missing_ok=True)
            try:
                mp.spawn(_worker, args=(world, free_port(), rest, config, str(done), progress), nprocs=world, join=True)
                crash = ""
            except Exception as err:  # noqa: BLE001 - whatever killed the launch is reported on its job
                crash = " ".join(str(err).split())[-300:]
            finished = [json.loads(line) for line in done.read_text().splitlines()] if done.exists() else []
            results.extend(finished)
            if crash and len(results) < len(jobs):
                died_on[len(results)] = died_on.get(len(results), 0) + 1
                if died_on[len(results)] > LAUNCH_RETRIES:  # else the job is tried again: the cause may be outside
                    results.append({"median_s": float("nan"), "steps_s": [], "warmup_s": [], "error": f"launch died: {crash}"})
    return [
        StepTimes(item["median_s"], tuple(item["steps_s"]), tuple(item["warmup_s"]), item["error"],
                  item.get("foreign_share", float("nan")), item.get("attempts", 0), item.get("ops", 0))
        for item in results
    ]


@contextmanager
def _single_thread_env():
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _worker(rank: int, world: int, port: int, jobs: list[MeasureJob], config: MeasureConfig, out_path: str, progress) -> None:
    """Time ``jobs`` in order; rank 0 appends one JSON line per job to ``out_path``."""
    torch.set_num_threads(1)  # many processes share few cores
    for name in _NOISY_LOGGERS:  # once-per-rank notes about gloo fallbacks, eight times over
        logging.getLogger(name).setLevel(logging.ERROR)
    meshes: dict[tuple, object] = {}  # one DeviceMesh per shape: each new one adds process groups and threads
    with process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    ):
        for job in jobs:
            try:
                result = _time_job(job, config, meshes)
            except Exception as err:  # noqa: BLE001 - the same layout fails the same way on every rank
                if os.environ.get("AUTOPLAN_MEASURE_DEBUG"):
                    import traceback

                    traceback.print_exc()
                result = {"median_s": float("nan"), "steps_s": [], "warmup_s": [], "error": f"{type(err).__name__}: {str(err)[:300]}"}
            gc.collect()  # the job's model and optimizer state go before the next job is timed
            dist.barrier()
            if rank == 0:
                with open(out_path, "a") as f:
                    f.write(json.dumps(result) + "\n")
                if progress:
                    with open(progress, "a") as f:
                        f.write(json.dumps({"label": job.label, **result}) + "\n")


def _mesh(meshes: dict, shape: tuple[int, ...], names: tuple[str, ...] | None):
    from torch.distributed.device_mesh import init_device_mesh

    key = (tuple(shape), tuple(names) if names else None)
    if key not in meshes:
        meshes[key] = init_device_mesh("cpu", key[0], mesh_dim_names=key[1])
    return meshes[key]


def _time_job(job: MeasureJob, config: MeasureConfig, meshes: dict) -> dict:
    import autoplan
    from autoplan.model_file import import_model_file, loss_function

    if job.model_file == OP_OVERHEAD_PROBE:
        return _time_steps(_probe_step(_mesh(meshes, (dist.get_world_size(),), None)), config, per_op=True)
    plan = autoplan.Plan.from_dict(json.loads(job.plan_json))
    module = import_model_file(Path(job.model_file))  # a fresh module: builders may keep state
    shape, names = (plan.mesh_shape, plan.axis_names) if plan.pipeline is None else \
        plan.pipeline.full_mesh(tuple(plan.mesh_shape), tuple(plan.axis_names))
    mesh = _mesh(meshes, shape, names)
    torch.manual_seed(config.seed)
    model = getattr(module, job.builder)()
    torch.manual_seed(config.seed + 1)
    batch = module.example_inputs()
    batch = batch if isinstance(batch, (dict, tuple)) else (batch,) if isinstance(batch, torch.Tensor) else tuple(batch)
    # With the file's compute_loss the model returns that loss: the step timed is the one planned.
    applied = autoplan.apply_plan(model, plan, mesh, loss_fn=loss_function(module, Path(job.model_file)))
    if plan.pipeline is not None:  # the schedule's step on the global batch, then the rank's optimizer
        # ops not counted: a rank dispatches only its stages' share, which no per-step figure compares
        return _time_steps(_pipelined_step(applied, batch), config, count_ops=False)
    local = autoplan.shard_batch(batch, plan, mesh)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    run = model
    if job.compile != "none":
        from autoplan.verify.compiled import compile_model

        run = compile_model(model, job.compile)

    def step():
        output = run(**local) if isinstance(local, dict) else run(*local)
        autoplan.training_loss(output).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # A dispatch mode around a compiled step would make dynamo trace it again: not counted.
    return _time_steps(step, config, count_ops=job.compile == "none")


def _pipelined_step(pipelined, batch):
    optimizer = torch.optim.AdamW([p for p in pipelined.parameters() if p.requires_grad], lr=1e-4)

    def step():
        pipelined.step(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _probe_step(mesh):
    """One step of PROBE_OPS tiny ops (half elementwise, half views) on a replicated DTensor,
    forward and backward: what DTensor and autograd add to every op of a step."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    x = distribute_tensor(torch.ones(8, 16), mesh, [Replicate()]).requires_grad_()

    def step():
        y = x
        for i in range(PROBE_OPS // 2):
            y = (y * 1.0001).view((16, 8) if i % 2 == 0 else (8, 16))
        y.sum().backward()
        x.grad = None

    return step


def _time_steps(step, config: MeasureConfig, per_op: bool = False, count_ops: bool = True) -> dict:
    """Warm up, time, and count the ops one step dispatches; ``per_op`` divides times by that count."""
    dist.barrier()
    warm = _run(step, config.warmup)
    slowest = torch.tensor([warm[-1] if warm else 0.0], dtype=torch.float64)  # the first step fills caches
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    count = config.steps
    if slowest.item() > 0:
        count = max(config.min_steps, min(config.steps, int(config.budget_s / slowest.item())))
    best: tuple[list[float], float] | None = None
    for attempt in range(1 + config.retries):
        if attempt:
            time.sleep(config.quiet_wait_s)
            _run(step, 1)
        steps, foreign = _timed_steps(step, count)
        if best is None or foreign < best[1]:
            best = (steps, foreign)
        if not foreign > config.max_foreign_share:  # NaN (no /proc) is taken as undisturbed
            break
    assert best is not None  # the loop ran at least once
    steps, foreign = best
    counter = _OpCounter()
    if count_ops:
        with counter:
            step()
    if per_op:
        steps, warm = [t / counter.ops for t in steps], [t / counter.ops for t in warm]
    return {"median_s": statistics.median(steps), "steps_s": steps, "warmup_s": warm, "error": "",
            "foreign_share": foreign, "attempts": attempt + 1, "ops": counter.ops}


class _OpCounter(TorchDispatchMode):
    """Counts the ops a step dispatches at the top level: DTensor ops, not the local ops inside them."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _timed_steps(step, count: int) -> tuple[list[float], float]:
    """Step times (slowest rank) and the share of host CPU other programs took meanwhile."""
    dist.barrier()
    host_before, own_before = _host_cpu(), _own_cpu()
    spans = _spans(step, count)
    host_after, own_after = _host_cpu(), _own_cpu()
    gathered: list[Any] = [None] * dist.get_world_size()  # each rank's (spans, own CPU, host CPU before, after)
    dist.all_gather_object(gathered, (spans, own_after - own_before, host_before, host_after))
    # Step i runs from the first rank's start to the last rank's end.
    steps = [
        max(spans_[i][1] for spans_, *_ in gathered) - min(spans_[i][0] for spans_, *_ in gathered)
        for i in range(count)
    ]
    (_, _, (busy0, total0), (busy1, total1)) = gathered[0]  # rank 0's view of the host, the same for all
    own = sum(item[1] for item in gathered)
    foreign = (busy1 - busy0 - own) / (total1 - total0) if total1 > total0 else float("nan")
    return steps, max(0.0, foreign)


def _host_cpu() -> tuple[float, float]:
    """(busy, total) CPU time of the whole host in clock ticks, from /proc/stat; NaN elsewhere."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return float("nan"), float("nan")
    return float(sum(values) - values[3] - values[4]), float(sum(values))


def _own_cpu() -> float:
    """CPU time this process (all its threads) used, in clock ticks, from /proc/self/stat."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return float(int(fields[11]) + int(fields[12]))  # utime, stime
    except (OSError, ValueError, IndexError):
        return float("nan")


def _run(step, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.monotonic()
        step()
        times.append(time.monotonic() - started)
    return times


def _spans(step, count: int) -> list[tuple[float, float]]:
    """(start, end) of each step on this rank, every step started together after a barrier."""
    spans = []
    for _ in range(count):
        dist.barrier()
        start = time.monotonic()
        step()
        spans.append((start, time.monotonic()))
    return spans
