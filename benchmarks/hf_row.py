"""One row of ``hf_coverage.py`` (and ``plain_coverage.py``): one model, every stage, in its own process.

A row's model is a model file (``autoplan/model_file.py``: ``build_model``, ``example_inputs``,
optional ``compute_loss``); ``hf_model_file_text`` writes the one for a HuggingFace row.

Stages, each recorded as ``{"ok", "cause", "seconds", ...}`` and written to the row's JSON
file as soon as it ends (so a row killed by its timeout still tells how far it got):

- ``build``: the tiny model built on the CPU, and one forward and backward
  of it on the tiny batch there (a model that cannot take that batch is "not built");
  ``build bfloat16``: the same in bfloat16 before that dtype's runs (a model that cannot
  train in bfloat16 on one device has no bfloat16 runs);
- per dtype (float32, bfloat16) and budget (``default``: the profile's device memory;
  ``forced``: the least memory any plan needs plus a sixty-fourth of the replicated model
  state, so that weights must shard on every mesh axis; checked on the plan):
  ``plan`` (``suggest_with_report`` on the meta device, 2x4), ``apply`` (the plan applied on a
  fake process group of 8, one step of forward, backward and AdamW) and ``collectives`` (the
  collectives of that step equal to ``plan.predicted``'s, per axis and kind);
- ``numerics``: float32 plans on 8 gloo processes, loss and gradients against one device.

Nothing is cached: every plan is solved (``suggest_with_report`` has no cache) and every
step gets a freshly built model.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from hf_tiny import model_class_name

MESH, AXIS_NAMES, WORLD = (2, 4), ("dp", "tp"), 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUDGETS = ("default", "forced")
GIB = 2**30
TOLERANCE = 1e-5
FORCED_SLACK = 1 / 64
"""The forced budget is the least memory any plan needs plus this share of the replicated
model state (parameters, gradients, AdamW moments). Splitting a weight on the tp axis alone
instead of on both axes costs an eighth of its state, so where the leanest plan splits every
weight on both axes, at most about an eighth of the weight bytes can stay off either axis.
(A sixteenth, with the loss on logits split by class saving activations elsewhere, left a
tiny Phi's layers whole on dp.)"""
EVERY_AXIS_SHARE = 0.5
"""A forced plan "shards weights on every axis" when at least this share of the parameter
bytes is split on both mesh axes."""
BENCH_DIR = Path(__file__).resolve().parent


def run_row(row: dict, model_file: Path, dtypes: list[str], numerics: bool, numerics_max_step_s: float, out: Path,
            fake: bool = False, more_stages=None, plan_outside_group: bool = False) -> dict:
    """Every stage of one row, whose model and batch come from ``model_file`` (a model file,
    ``autoplan/model_file.py``: ``build_model``, ``example_inputs``, optional ``compute_loss``);
    ``row`` names it (``task``, ``model_type``, ``class``). ``dtypes`` empty stops after the build.

    ``fake`` (models at real widths): no weights are made. The build is on the meta device
    (no one-device step), each plan's step runs on its fake twin as ``autoplan verify`` runs
    it (``verify/fake_model.py``: the same collectives at the same shapes, no compute), and
    no numerics run. ``more_stages(recorder, plans, device_mesh)``, where given, runs further
    stages on the fake process group after the plans' steps (``vision_coverage.py``'s compiled step).

    ``plan_outside_group``: each plan is made with no process group up, as ``autoplan suggest``
    makes it, so ``suggest`` prices it by a dry run of its step (``verify/dry_run.py``; with a
    group up, as in a job, the dry run cannot host its fake world and the rules predict).
    Off, every plan is made beside the rows' fake process group: the rules' prediction is
    what the ``collectives`` stages judge."""
    row = {**row, "stages": {}}
    recorder = _Recorder(row, out)
    with recorder.stage("build") as info:
        if fake:
            _build_on_meta(model_file, info)
        else:
            _build_and_step(model_file, info)
    if not row["stages"]["build"]["ok"] or not dtypes:
        return row

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def fake_mesh():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
        return init_device_mesh("cpu", MESH, mesh_dim_names=AXIS_NAMES)

    device_mesh = fake_mesh()
    plans: dict[str, object] = {}
    try:
        for dtype_name in dtypes:
            if dtype_name != "float32" and not fake:
                with recorder.stage(f"build {dtype_name}") as info:
                    _build_and_step(model_file, info, DTYPES[dtype_name])
                if not row["stages"][f"build {dtype_name}"]["ok"]:
                    continue
            default = None
            prepared: list = []  # the row's problem, prepared by its first plan and solved at every budget
            for budget in BUDGETS:
                key = f"{dtype_name}/{budget}"
                if budget == "forced" and default is None:
                    # Sized from the default plan, and its planning would fail the same way.
                    row["stages"][f"plan {key}"] = {**row["stages"][f"plan {dtype_name}/default"], "skipped": True}
                    recorder.save()
                    continue
                if plan_outside_group:
                    dist.destroy_process_group()
                try:
                    with recorder.stage(f"plan {key}") as info:
                        plan = _plan(model_file, DTYPES[dtype_name], default, info, prepared)
                finally:
                    if plan_outside_group:
                        device_mesh = fake_mesh()
                if not row["stages"][f"plan {key}"]["ok"]:
                    continue
                if budget == "default":
                    default = plan
                plans[key] = plan
                with recorder.stage(f"apply {key}") as info:
                    verification = _step(model_file, DTYPES[dtype_name], plan, device_mesh, fake)
                if row["stages"][f"apply {key}"]["ok"]:
                    with recorder.stage(f"collectives {key}") as info:
                        _judge_collectives(verification, info)
        if more_stages is not None:
            more_stages(recorder, plans, device_mesh)
    finally:
        dist.destroy_process_group()

    if numerics and not fake:
        _run_numerics(row, recorder, model_file, plans, numerics_max_step_s)
    return row


def run_source_row(spec: str, out: Path, dtypes: list[str], numerics: bool, numerics_max_step_s: float,
                   class_name, model_file_text, more_stages=None, plan_outside_group: bool = False) -> None:
    """One ``source:name`` row of a benchmark whose rows are written by ``model_file_text``
    (``plain_coverage.py``, ``vision_coverage.py``), in this process: its model file next to
    ``out``, then ``run_row``. ``more_stages(recorder, plans, device_mesh, model_file)``, where
    given, runs after the plans' steps; ``plan_outside_group``: ``run_row``'s."""
    torch.set_num_threads(1)  # rows run side by side on few cores
    source, name = spec.split(":", 1)
    model_file = out.with_suffix(".model.py")
    model_file.write_text(model_file_text(source, name))
    row = {"task": source, "model_type": name, "class": class_name(source, name)}
    extra = None if more_stages is None else (lambda recorder, plans, mesh: more_stages(recorder, plans, mesh, model_file))
    run_row(row, model_file, dtypes, numerics, numerics_max_step_s, out, more_stages=extra,
            plan_outside_group=plan_outside_group)


def load_row_model(model_file: Path, dtype: torch.dtype = torch.float32):
    """``(model, batch, loss_fn)`` from a fresh import of the model file, on the current
    default device. For bfloat16 the model is cast as transformers' ``from_pretrained(dtype=...)``
    loads one: every floating tensor in the dtype but those the model keeps in float32 by
    name (``_keep_in_fp32_modules_strict``: a router's weight, for stable routing), where a
    whole ``.to(dtype)`` would cast them and break the model. The batch's floating tensors
    are cast (token ids unchanged)."""
    from autoplan.model_file import import_model_file, loss_function
    from autoplan.verify.numerics import seeded_batch

    module = import_model_file(Path(model_file))
    model = module.build_model()
    batch = seeded_batch(module, 0)
    if dtype != torch.float32:
        _cast_but_kept(model, dtype)
        cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        batch = {k: cast(v) for k, v in batch.items()} if isinstance(batch, dict) else tuple(map(cast, batch))
    return model, batch, loss_function(module, Path(model_file))


def _cast_but_kept(model, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating parameters and buffers to ``dtype`` in place, but for those
    whose name matches one of its ``_keep_in_fp32_modules_strict`` patterns (``*`` for any
    text, searched in the name, as transformers matches them)."""
    patterns = sorted(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    kept = re.compile("|".join(p.replace("*", ".*") for p in patterns)) if patterns else None
    for prefix, sub in model.named_modules():
        for store in (sub._parameters, sub._buffers):
            for name, tensor in store.items():
                full = f"{prefix}.{name}" if prefix else name
                if tensor is None or not tensor.is_floating_point() or (kept is not None and kept.search(full)):
                    continue
                if isinstance(tensor, torch.nn.Parameter):
                    tensor.data = tensor.data.to(dtype)
                else:
                    store[name] = tensor.to(dtype)


def _build_and_step(model_file: Path, info: dict, dtype: torch.dtype = torch.float32) -> None:
    """The tiny model builds and takes a forward and backward on one device: what is left
    to fail after this is autoplan's (or the parallel model's), not the batch's or the dtype's."""
    from autoplan.trace.loss import model_loss
    from autoplan.verify.numerics import call_model

    torch.manual_seed(0)
    model, batch, loss_fn = load_row_model(model_file, dtype)
    info["parameters"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    started = time.perf_counter()
    model_loss(call_model(model, batch, loss_fn), batch, loss_fn).backward()
    info["eager_step_seconds"] = round(time.perf_counter() - started, 3)


def _build_on_meta(model_file: Path, info: dict) -> None:
    """The model builds (on the meta device: at real widths no weights are made) and its batch loads."""
    with torch.device("meta"):
        model, _, _ = load_row_model(model_file)
    info["parameters"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _plan(model_file: Path, dtype: torch.dtype, default, info: dict, prepared: list):
    """The default-budget plan, or (after it) the forced-budget one: the least memory any
    plan needs plus a sixty-fourth of the replicated model state (``FORCED_SLACK``).
    ``prepared`` holds the row's traced and costed problem once the first plan made it
    (an empty list before): every budget solves that one (``problem.at_budget``)."""
    from autoplan.errors import InfeasibleError

    if default is None:
        return _suggest(model_file, dtype, None, info, prepared)
    started = time.perf_counter()
    try:  # a budget no plan meets: the solver says what the leanest plan needs
        return _checked(model_file, _suggest(model_file, dtype, 1.0, info, prepared), info)
    except InfeasibleError as err:
        smallest = err.smallest_bytes
    info["probe_seconds"] = round(time.perf_counter() - started, 3)
    info["smallest_gib"] = smallest / GIB
    budget = smallest + FORCED_SLACK * _replicated_state_bytes(model_file, dtype)
    return _checked(model_file, _suggest(model_file, dtype, budget, info, prepared), info)


def _checked(model_file: Path, plan, info: dict):
    share = _every_axis_share(model_file, plan)
    info["every_axis_share"] = round(share, 3)
    info["sharded_every_axis"] = share >= EVERY_AXIS_SHARE
    return plan


def _replicated_state_bytes(model_file: Path, dtype: torch.dtype) -> int:
    """Parameters, gradients and two AdamW moments, whole on one device."""
    with torch.device("meta"):
        model, _, _ = load_row_model(model_file, dtype)
    unique = {id(p): p for p in model.parameters()}.values()
    return 4 * sum(p.numel() * p.element_size() for p in unique)


def _suggest(model_file: Path, dtype: torch.dtype, budget_bytes: float | None, info: dict, prepared: list):
    """``suggest`` at ``budget_bytes`` (None: the profile's), on the row's problem where
    ``prepared`` has it (else prepared here and kept there). ``plan_seconds``: the first
    plan's include tracing and costing, the others' solving and pricing only."""
    from autoplan.pipeline.problem import at_budget, prepare_problem
    from autoplan.pipeline.suggest import suggest_with_report

    started = time.perf_counter()
    memory_gib = budget_bytes / GIB if budget_bytes else None
    if not prepared:
        with torch.device("meta"):
            model, batch, loss_fn = load_row_model(model_file, dtype)
        prepared.append(prepare_problem(model, batch, MESH, AXIS_NAMES, loss_fn=loss_fn))
    problem = at_budget(prepared[0], memory_gib=memory_gib)
    step = problem.step
    assert step is not None  # prepare_problem keeps the model and batch
    plan, _report = suggest_with_report(step.model, step.batch, MESH, AXIS_NAMES, loss_fn=step.loss_fn,
                                        problem=problem)
    info["plan_seconds"] = round(time.perf_counter() - started, 3)
    info["budget_gib"] = memory_gib
    info["peak_gib"] = plan.predicted.peak_memory_bytes / GIB
    info["solver"] = plan.solver.status
    info["fallback_ops"] = len(plan.fallback_ops)
    info["opaque_modules"] = len(plan.opaque_modules)
    info["inputs"] = {key: list(layout.placements) for key, layout in plan.inputs.items()}  # the batch's layout
    return plan


def _every_axis_share(model_file: Path, plan) -> float:
    """Share of parameter bytes the plan splits on every mesh axis (tied weights once)."""
    with torch.device("meta"):
        model, _, _ = load_row_model(model_file)
    sizes = {fqn: p.numel() for fqn, p in model.named_parameters()}  # tied FQNs appear once
    total = sum(sizes.values())
    split = sum(n for fqn, n in sizes.items() if all("S(" in p for p in plan.parameters.get(fqn, ("R",))))
    return split / total if total else 0.0


def _step(model_file: Path, dtype: torch.dtype, plan, device_mesh, fake: bool = False):
    from autoplan.verify.step_check import verify_plan

    torch.manual_seed(0)
    if not fake:
        model, batch, loss_fn = load_row_model(model_file, dtype)
        return verify_plan(model, batch, plan, device_mesh, loss_fn=loss_fn)
    with torch.device("meta"):  # its fake twin is stepped: no weights are made
        model, _, loss_fn = load_row_model(model_file, dtype)
    _, batch, _ = _batch_only(model_file, dtype)
    return verify_plan(model, batch, plan, device_mesh, loss_fn=loss_fn, tensors="fake")


def _batch_only(model_file: Path, dtype: torch.dtype):
    """The row's batch, made on the CPU (the step on a fake twin reads the batch for real)."""
    from autoplan.model_file import import_model_file
    from autoplan.verify.numerics import seeded_batch

    batch = seeded_batch(import_model_file(Path(model_file)), 0)
    if dtype != torch.float32:
        cast = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        batch = {k: cast(v) for k, v in batch.items()} if isinstance(batch, dict) else tuple(map(cast, batch))
    return None, batch, None


def _judge_collectives(verification, info: dict) -> None:
    info["mismatches"] = [
        {"axis": r.axis, "kind": r.kind, "predicted": list(r.predicted), "observed": list(r.observed)}
        for r in verification.mismatches
    ]
    info["modules"] = [  # where: the module rows that differ
        {"module": r.module, "axis": r.axis, "kind": r.kind, "predicted": list(r.predicted), "observed": list(r.observed)}
        for r in verification.moved
    ]
    if not verification.passed:  # one cause for every model; which kinds differ is in "mismatches"
        raise CollectivesDiffer("observed != predicted")


class CollectivesDiffer(Exception):
    pass


def _run_numerics(row: dict, recorder, model_file: Path, plans: dict, max_step_s: float) -> None:
    """Float32 plans whose step ran and ran fast, in one launch of 8 gloo processes."""
    from autoplan.verify.numerics import NumericsJob, check_numerics

    stages = row["stages"]
    keys = [
        key for key in (f"float32/{b}" for b in BUDGETS)
        if key in plans and stages.get(f"apply {key}", {}).get("ok") and stages[f"apply {key}"]["seconds"] <= max_step_s
    ]
    if not keys:
        return
    jobs = [NumericsJob(str(model_file), "build_model", plans[key].to_json()) for key in keys]
    with recorder.stage("numerics launch") as info:
        info["jobs"] = keys
        results = check_numerics(jobs, world=WORLD)
    launch = stages["numerics launch"]
    for index, key in enumerate(keys):
        entry = {"ok": False, "cause": launch["cause"], "seconds": launch["seconds"]}
        if launch["ok"]:
            result = results[index]
            worst = result.worst
            entry.update(worst=worst, ok=worst <= TOLERANCE, cause=None if worst <= TOLERANCE else "relative error above 1e-5")
            errors = {"loss": result.loss, **result.gradients, **result.buffers}
            entry["worst_at"] = max(errors, key=errors.get)
        stages[f"numerics {key}"] = entry
    recorder.save()


def class_name(task: str, model_type: str) -> str:
    try:
        return model_class_name(task, model_type)
    except Exception:
        return ""


def hf_model_file_text(task: str, model_type: str, shape: tuple[int, int] | None = None, widths: str = "tiny") -> str:
    """A model file (``autoplan/model_file.py``'s convention) that builds this row's model;
    ``shape`` (batch, sequence) sets its batch (``hf_tiny.tiny_inputs``'s by default);
    ``widths`` "real" keeps the shipped sizes but the layer count (``hf_tiny.few_layers_config``)."""
    sizes = "" if shape is None else f", batch={shape[0]}, seq={shape[1]}"
    config = {"tiny": "tiny_config", "real": "few_layers_config"}[widths]
    return (
        f'"""hf_coverage row: the {model_type} for {task}, {widths} widths."""\n'
        "import sys\n"
        f"sys.path.insert(0, {str(BENCH_DIR)!r})\n"
        f"from hf_tiny import build_tiny_model, {config}, tiny_inputs\n\n\n"
        f"def build_model():\n    return build_tiny_model({task!r}, {model_type!r}, config={config}({model_type!r}))\n\n\n"
        f"def example_inputs():\n    return tiny_inputs({task!r}, {config}({model_type!r}){sizes})\n"
    )


def short_cause(err: BaseException) -> str:
    """Exception type and the first line of its message, without addresses or numbers, so
    that one cause in many models reads the same."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if type(err).__name__ == "ProcessRaisedException" and lines:  # a rank's traceback: its last line
        text = lines[-1].strip()
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"'[^']{40,}'", "'…'", text)
    return f"{type(err).__name__}: {text}"[:160]


class _Recorder:
    """Runs stages, records each one's outcome, and keeps the row's JSON file current."""

    def __init__(self, row: dict, out: Path):
        self.row, self.out = row, out

    @contextmanager
    def stage(self, name: str):
        info: dict = {"ok": False, "cause": "running", "seconds": None}
        self.row["stages"][name] = info
        self.save()
        started = time.perf_counter()
        try:
            yield info
            info.update(ok=True, cause=None)
        except Exception as err:
            info["cause"] = short_cause(err)
            info["error"] = f"{type(err).__name__}: {str(err)[:2000]}"
        finally:
            info["seconds"] = round(time.perf_counter() - started, 3)
            self.save()

    def save(self) -> None:
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.row, default=str))
        os.replace(tmp, self.out)
