"""Predicted against measured peak memory per device, by category (issue 17).

Each row plans a model with ``autoplan.suggest`` for a mesh and a budget, applies the plan
on rank 0 of a fake process group to a model whose tensors are all fake (built on meta,
materialised by ``apply_plan`` inside ``FakeTensorMode``: real shapes, no real memory), runs
one warm-up training step (so AdamW's state exists, as in every step but the first) and
then measures one step (forward, backward, ``AdamW.step()``, ``zero_grad``) with torch's
``MemTracker``. MemTracker lets DTensor desugar into local ops before it counts, so it sees
what rank 0 holds: local shards, the buffers of the collectives, the temporaries of each
kernel. Its categories are printed beside the plan's prediction split the same way.

Budgets: "default" is the profile's device memory; "lean" is the least any plan needs
(``InfeasibleError.smallest_bytes``) plus 10 %, which forces sharding.

    python benchmarks/memory.py [--rows gpt2-8,llama-2x4-lean,...] [--json OUT] [--timeout 300]

On a GPU the same plans are measured for real: ``--stage plan`` plans every row and writes
its plan to ``--plans DIR`` (no GPU needed), and ``--stage measure --device cuda`` applies
each plan on rank 0 of a fake process group whose tensors are real CUDA tensors, and reads
``torch.cuda.max_memory_allocated()`` over one step after a warm-up step, each row in a
process of its own (a device-side assert leaves a process's CUDA context unusable). The fake process
group communicates nothing, but every collective allocates its output as NCCL's would, and
every kernel runs at its real shapes, so rank 0 holds what it holds on a real cluster. The
two stages can run on different machines (a GPU host with another torch measures plans made
here):

    python benchmarks/memory.py --stage plan --plans DIR
    python benchmarks/memory.py --stage measure --device cuda --plans DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autoplan  # noqa: E402
from autoplan._files import write_atomic  # noqa: E402
from autoplan.errors import InfeasibleError  # noqa: E402
from autoplan.explain.progress import rows_on_stderr  # noqa: E402
from autoplan.model_file import default_axis_names, import_model_file, loss_function  # noqa: E402
from autoplan.verify.numerics import call_model  # noqa: E402

GIB = 2**30
_WRAP_FOR_AUTOGRAD = torch.ops._c10d_functional._wrap_tensor_autograd.default
LEAN_MARGIN = 1.10
"""The lean budget: the least any plan needs, plus this much (and again, until a plan fits)."""
LEAN_TRIES = 6
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations", "temporaries")
_TRACKER_NAMES = {
    "PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients", "OPT": "optimizer",
    "ACT": "activations", "TEMP": "temporaries", "OTH": "temporaries",
}


@dataclass(frozen=True, slots=True)
class Model:
    file: str
    """examples/<file>.py"""
    build: str
    """Builder in that file, or "llama3:<size>" for the Llama-3 widths cut to 2 layers."""


MODELS = {
    "transformer": Model("transformer", "make_big"),
    "gpt2": Model("gpt2", "make_big"),
    "bert": Model("bert", "make_big"),
    "llama": Model("llama", "build_model"),
    "moe": Model("moe", "build_model"),
    "llama3-8b": Model("llama3", "llama3:8b"),
    "llama3-70b": Model("llama3", "llama3:70b"),
    "llama3-1b": Model("llama3", "make_1b"),
}
MESHES = {"8": (8,), "2x4": (2, 4), "8x8": (8, 8)}
ROWS = tuple(
    f"{model}-{mesh}{suffix}"
    for model, meshes in (
        ("transformer", ("8", "2x4")), ("gpt2", ("8", "2x4")), ("bert", ("8", "2x4")),
        ("llama", ("8", "2x4")), ("moe", ("8", "2x4")), ("llama3-8b", ("8x8",)), ("llama3-70b", ("8x8",)),
        ("llama3-1b", ("2x4",)),
    )
    for mesh in meshes
    for suffix in ("", "-lean")
)


def build(model: Model):
    """(model on meta, the example-inputs function, the loss function): a fresh model per call."""
    module = import_model_file(ROOT / "examples" / f"{model.file}.py")
    with torch.device("meta"):
        if model.build.startswith("llama3:"):
            built = module._llama3(model.build.partition(":")[2], num_hidden_layers=2)
        else:
            built = getattr(module, model.build)()
    return built, module.example_inputs, loss_function(module, Path(module.__file__))


def batch_of(inputs):
    batch = inputs()
    return batch if isinstance(batch, (dict, tuple)) else (batch,)


def plan_row(model: Model, mesh, lean: bool):
    """(plan, budget in bytes or None, planning seconds)."""
    names = default_axis_names(mesh)
    started = time.perf_counter()

    def suggest(memory_gib):
        net, inputs, loss_fn = build(model)
        with torch.device("meta"):
            batch = batch_of(inputs)
        return autoplan.suggest(
            net, batch, mesh=mesh, axis_names=names, memory_gib=memory_gib, cache=False, broadcast=False, loss_fn=loss_fn
        )

    if not lean:
        return suggest(None), None, time.perf_counter() - started
    try:
        suggest(1e-9)
        raise AssertionError("a plan fitting 1 byte per device")
    except InfeasibleError as err:
        budget = err.smallest_bytes * LEAN_MARGIN
    # smallest_bytes is the least peak the solver finds; where it stopped early it is only a
    # bound below the leanest plan: raise the budget until one fits.
    for _ in range(LEAN_TRIES):
        try:
            return suggest(budget / GIB), budget, time.perf_counter() - started
        except InfeasibleError:
            budget *= LEAN_MARGIN
    raise InfeasibleError(f"no plan within {LEAN_TRIES} budgets up to {budget / GIB:.3g} GiB")


@contextmanager
def alltoall_as_on_gpus():
    """DTensor's all_to_all run as one collective, as NCCL runs it. On a CPU mesh DTensor
    falls back to an all-gather of the whole axis and a chunk of it (gloo has no all_to_all),
    which holds the axis size times the shard for a moment: the plans measured here are
    for GPUs (the default profile). The collective's own op, on the fake process group,
    returns its output without communicating. Its fake kernel (the tensors measured are
    fake) gathers the whole axis and narrows it: where the new split is on the outermost
    dim the narrow is already contiguous and keeps the whole gather alive, the axis size
    times the output. The output is then made anew, as NCCL's all_to_all makes it (the
    data of a fake tensor is nothing to keep)."""
    from torch.distributed._functional_collectives import _group_or_group_name, _resolve_group
    from torch.distributed.tensor import _collective_utils, _redistribute, placement_types

    def shard_dim_alltoall(input, gather_dim, shard_dim, mesh, mesh_dim):
        group = _group_or_group_name(_resolve_group((mesh, mesh_dim)))
        out = torch.ops._dtensor.shard_dim_alltoall(input, gather_dim, shard_dim, group)
        if out.untyped_storage().nbytes() == out.numel() * out.element_size():
            return out
        shape = out.shape
        del out  # the gather goes before the output is made
        return input.new_empty(shape)

    patched = [m for m in (_collective_utils, _redistribute, placement_types) if hasattr(m, "shard_dim_alltoall")]
    originals = [m.shard_dim_alltoall for m in patched]
    for m in patched:
        m.shard_dim_alltoall = shard_dim_alltoall
    try:
        yield
    finally:
        for m, original in zip(patched, originals):
            m.shard_dim_alltoall = original


class _Tracker(MemTracker):
    """``MemTracker`` that lets a collective's output keep its storage when DTensor wraps it
    for autograd: the wrapping op's fake kernel makes a new tensor (``empty_like``), where
    on a device it wraps the same memory. MemTracker already does so for ``wait_tensor``,
    whose fake kernel copies likewise; without it every all-gathered weight is counted twice."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _WRAP_FOR_AUTOGRAD and isinstance(args[0], FakeTensor):
            return args[0]
        return super().__torch_dispatch__(func, types, args, kwargs)


def measure_step(model: Model, plan, make=None) -> dict:
    """Rank 0's peak over one training step after a warm-up step, by category (bytes).
    ``make()``, when given, builds (model on meta, example-inputs function, loss function)
    instead of ``build(model)``."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    from autoplan.dtensor import overrides

    # A new mesh compares equal to the previous row's: decisions cached for that one name
    # its destroyed process groups.
    _clear_sharding_prop_cache()
    overrides._own_cache = None
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(plan.mesh_shape))
    try:
        device_mesh = init_device_mesh("cpu", tuple(plan.mesh_shape), mesh_dim_names=tuple(plan.axis_names))
        net, inputs, loss_fn = make() if make is not None else build(model)
        # allow_non_fake_inputs: to_empty reads the meta weights, and the step mixes the fake
        # weights with the small tensors the model makes itself (position ids, masks).
        with FakeTensorMode(allow_non_fake_inputs=True):
            materialize_fake(net)
        # The batch is real (token ids, a few MiB at most): models read it (BERT checks its
        # attention mask for padding), which a fake tensor cannot answer.
        torch.manual_seed(0)
        batch = batch_of(inputs)
        # The rest runs outside the fake mode (ops on the fake weights and batch stay fake):
        # DTensor computes shard offsets with small tensors it reads back (``int(offsets[0])``),
        # which a fake tensor cannot give.
        autoplan.apply_plan(net, plan, device_mesh, loss_fn=loss_fn)
        local = next(p for p in net.parameters())
        assert type(local.to_local()).__name__ == "FakeTensor", "the measured step must run on fake tensors"
        step, optimizer = training_step(net, plan, device_mesh, batch)

        with alltoall_as_on_gpus():
            step()
            tracker = _Tracker()
            tracker.track_external(net, optimizer)
            with tracker:
                step()
    finally:
        dist.destroy_process_group()
    return by_category(tracker)


def by_category(tracker: MemTracker) -> dict:
    """MemTracker's peak in this benchmark's categories (bytes), and their sum."""
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    measured = dict.fromkeys(CATEGORIES, 0)
    for key, value in peak.items():
        name = str(getattr(key, "name", key))
        if name in _TRACKER_NAMES:
            measured[_TRACKER_NAMES[name]] += int(value)
    measured["peak"] = int(sum(measured[c] for c in CATEGORIES))
    return measured


def training_step(net, plan, device_mesh, batch):
    """(a function running one training step of the applied ``net`` on this rank's slice of
    ``batch``: forward, backward, ``AdamW.step()``, ``zero_grad``; its optimizer)."""
    optimizer = torch.optim.AdamW(net.parameters())
    local_batch = autoplan.shard_batch(batch, plan, device_mesh)

    def step():
        loss = autoplan.training_loss(call_model(net, local_batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, optimizer


def measure_on_device(model: Model, plan, device: str = "cuda") -> dict:
    """Rank 0's peak on a real device, ``torch.cuda.max_memory_allocated`` over one training
    step after a warm-up step, less what was allocated before the row began; and MemTracker's
    split of the same step by category (``tracker``), on the real tensors."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    from autoplan.dtensor import overrides

    accelerator = getattr(torch, device)
    _clear_sharding_prop_cache()
    overrides._own_cache = None
    accelerator.set_device(0)
    runtime = _math_library_workspaces(device)
    before = accelerator.memory_allocated()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(plan.mesh_shape))
    try:
        device_mesh = init_device_mesh(device, tuple(plan.mesh_shape), mesh_dim_names=tuple(plan.axis_names))
        net, inputs, loss_fn = build(model)
        torch.manual_seed(0)
        batch = _on_device(batch_of(inputs), device)
        # Weights are allocated shard by shard on the device and left as they are: the fake
        # process group hands back every gathered or reduced tensor uninitialised anyway, so
        # no value in the step is meaningful, and none decides a shape (top-k routing keeps k).
        autoplan.apply_plan(net, plan, device_mesh, init=_values_unread, loss_fn=loss_fn)
        step, optimizer = training_step(net, plan, device_mesh, batch)

        step()
        accelerator.synchronize()
        accelerator.reset_peak_memory_stats()
        tracker = MemTracker()
        tracker.track_external(net, optimizer)
        with tracker:
            step()
        accelerator.synchronize()
        peak = accelerator.max_memory_allocated() - before
    finally:
        dist.destroy_process_group()
    del net, optimizer, step, batch
    gc.collect()
    accelerator.empty_cache()
    return {"peak": int(peak), "runtime": int(runtime), "tracker": by_category(tracker)}


def _math_library_workspaces(device: str) -> int:
    """Bytes the device's math libraries hold once they have run a matmul (cuBLAS and
    cuBLASLt allocate their workspaces through torch's allocator, once per process and
    stream, whatever the model): allocated here before the row, so that the row's peak is
    the step's own, and reported beside it."""
    accelerator = getattr(torch, device)
    start = accelerator.memory_allocated()
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.ones(64, 64, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(a, a, a[0]).sum().backward()  # addmm, mm and their backward
    del a
    accelerator.synchronize()
    return accelerator.memory_allocated() - start


def _values_unread(module) -> None:
    """``apply_plan``'s initialiser for a measurement whose values are never read."""


def _on_device(batch, device: str):
    if isinstance(batch, dict):
        return {key: _on_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_on_device(value, device) for value in batch)
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def materialize_fake(net) -> None:
    """Fake weights of the real shapes (no memory), tied parameters still tied: ``to_empty``
    gives each module's copy of a tied meta parameter a new Parameter of its own."""
    names: dict[int, list[str]] = {}
    for fqn, param in net.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(fqn)
    net.to_empty(device="cpu")
    for first, *others in names.values():
        shared = net.get_parameter(first)
        for fqn in others:
            owner, _, name = fqn.rpartition(".")
            setattr(net.get_submodule(owner), name, shared)


def predicted_split(plan) -> dict:
    """The plan's prediction by category. Plans with a ``memory`` split use it; older ones
    count model state as parameters x 4 (weights, gradients, AdamW's two moments)."""
    p = plan.predicted
    split = getattr(p, "memory", None)
    if split:
        found = {c: int(split.get(c, 0)) for c in CATEGORIES}
    else:
        quarter = p.model_state_bytes / 4
        found = dict.fromkeys(CATEGORIES, 0)
        found.update(parameters=int(quarter), gradients=int(quarter), optimizer=int(2 * quarter), activations=int(p.activation_bytes))
    found["peak"] = int(p.peak_memory_bytes)
    return found


def _out_of_time(signum, frame):
    raise TimeoutError


def run_row(row: str, timeout_s: int, stage: str = "all", plans: Path | None = None, device: str = "cpu") -> dict:
    """One row: plan it (``stage`` "all" or "plan"; "plan" writes the plan to ``plans``) or
    load its plan from ``plans`` ("measure"), then measure its step on ``device`` ("cpu":
    fake tensors under MemTracker; "cuda": real tensors, the device's allocator)."""
    name, _, rest = row.partition("-")
    if name == "llama3":  # "llama3-8b-8x8[-lean]"
        size, _, rest = rest.partition("-")
        name = f"llama3-{size}"
    mesh_text, _, budget_kind = rest.partition("-")
    model, mesh = MODELS[name], MESHES[mesh_text]
    result = {"row": row, "model": name, "mesh": mesh_text, "budget": budget_kind or "default", "device": device}
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(timeout_s)
    try:
        if stage == "measure":
            plan, plan_s = autoplan.Plan.load(plans / f"{row}.json"), None
            budget = plan.solver.memory_budget_bytes if budget_kind == "lean" else None
        else:
            plan, budget, plan_s = plan_row(model, mesh, budget_kind == "lean")
            plan_s = round(plan_s, 1)
        if stage == "plan":
            plan.save(plans / f"{row}.json")
            result.update(budget_bytes=budget, plan_s=plan_s, predicted=predicted_split(plan))
            return result
        started = time.perf_counter()
        measured = measure_step(model, plan) if device == "cpu" else measure_on_device(model, plan, device)
        result.update(
            budget_bytes=budget, plan_s=plan_s, step_s=round(time.perf_counter() - started, 1),
            predicted=predicted_split(plan), measured=measured,
            error=predicted_split(plan)["peak"] / measured["peak"] - 1,
            recompute=f"{','.join(sorted(set(plan.recompute.values())))} x{len(plan.recompute)}" if plan.recompute else "-",
        )
    except TimeoutError:
        result["failed"] = f"TIMEOUT after {timeout_s} s"
    except Exception as err:  # a row that fails is reported, the others still run
        result["failed"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    finally:
        signal.alarm(0)
    return result


def measure_in_own_process(row: str, timeout_s: int, plans: Path, device: str) -> dict:
    """``run_row(row, timeout_s, "measure", plans, device)`` in a process of its own: a kernel's
    device-side assert in one row leaves its process's CUDA context unusable, and every row
    after it would fail too (seen on an H200 whose torch cannot run BERT's plans)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        command = [sys.executable, __file__, "--stage", "measure", "--device", device, "--plans", str(plans),
                   "--rows", row, "--timeout", str(timeout_s), "--json", str(out), "--in-process"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 120)
        except subprocess.TimeoutExpired:
            return {"row": row, "failed": f"TIMEOUT after {timeout_s} s"}
        if out.is_file():
            return json.loads(out.read_text())[0]
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"row": row, "failed": f"its process exited with {done.returncode}: {last[:160]}"}


def _mib(value) -> str:
    return f"{value / 2**20:.1f}"


def _pairs(predicted: dict, measured: dict) -> tuple[str, ...]:
    """Predicted / measured MiB of model state (with buffers), gradients, optimizer state,
    and activations with temporaries."""
    def pair(*cats):
        return f"{_mib(sum(predicted[c] for c in cats))} / {_mib(sum(measured[c] for c in cats))}"

    return pair("parameters", "buffers"), pair("gradients"), pair("optimizer"), pair("activations", "temporaries")


def format_device_table(results: list[dict]) -> str:
    """Rows measured on a device: the allocator's peak beside the plan's prediction."""
    head = ("row", "pred peak", "device peak", "error", "+ math libraries", "recompute", "param p/m", "grad p/m",
            "optim p/m", "act+temp p/m", "step s")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in results:
        if "failed" in r:
            lines.append(f"{r['row']} | {r['failed']}")
            continue
        p, m = r["predicted"], r["measured"]["tracker"]
        lines.append(" | ".join((
            r["row"], _mib(p["peak"]), _mib(r["measured"]["peak"]), f"{r['error']:+.1%}",
            _mib(r["measured"]["runtime"]), r.get("recompute", "-"), *_pairs(p, m), str(r["step_s"]),
        )))
    return "\n".join(lines)


def format_table(results: list[dict]) -> str:
    head = ("row", "pred peak", "meas peak", "error", "recompute", "param p/m", "grad p/m", "optim p/m", "act+temp p/m",
            "plan s", "step s")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in results:
        if "failed" in r:
            lines.append(f"{r['row']} | {r['failed']}")
            continue
        p, m = r["predicted"], r["measured"]
        lines.append(" | ".join((
            r["row"], _mib(p["peak"]), _mib(m["peak"]), f"{r['error']:+.1%}", r.get("recompute", "-"),
            *_pairs(p, m), str(r["plan_s"]), str(r["step_s"]),
        )))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--json", help="write the results to this file (atomically)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per row (plan and step)")
    parser.add_argument("--stage", choices=("all", "plan", "measure"), default="all",
                        help="plan and measure (all), only plan and write the plans to --plans, or measure the plans there")
    parser.add_argument("--plans", default=str(ROOT / "benchmarks" / "results" / "memory_plans"),
                        help="where --stage plan writes the plans and --stage measure reads them")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: fake tensors under MemTracker; cuda: real tensors on one GPU, its allocator's peak")
    parser.add_argument("--in-process", action="store_true",
                        help="with --device cuda, measure every row in this process (by default each in its own)")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; expected some of {', '.join(ROWS)}")
    if args.device == "cuda" and args.stage != "plan" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU; plan here with --stage plan and measure on the GPU host")
    plans = Path(args.plans)
    if args.stage == "plan":
        plans.mkdir(parents=True, exist_ok=True)
    elif args.stage == "measure":
        missing = [r for r in rows if not (plans / f"{r}.json").is_file()]
        if missing:
            parser.error(f"no plan for {missing[:3]} in {plans}; write them with --stage plan --plans {plans}")
    results = []
    with rows_on_stderr(len(rows)) as progress:
        for row in rows:
            progress.started(row)
            if args.device != "cpu" and args.stage == "measure" and not args.in_process:
                results.append(measure_in_own_process(row, args.timeout, plans, args.device))
            else:
                results.append(run_row(row, args.timeout, args.stage, plans, args.device))
            r = results[-1]
            done = r.get("failed") or (format(r["error"], "+.1%") if "error" in r else f"planned in {r['plan_s']} s")
            print(f"{row}: {done}", file=sys.stderr, flush=True)
            progress.finished(row)
    if args.stage == "plan":
        print(f"plans of {sum('failed' not in r for r in results)} of {len(results)} rows written to {plans}")
        for r in results:
            if "failed" in r:
                print(f"{r['row']}: {r['failed']}")
    elif args.device == "cpu":
        print("memory per device in MiB; p/m = predicted / measured (MemTracker, rank 0, fake process group)")
        print(format_table(results))
    else:
        name = torch.cuda.get_device_name(0)
        print(f"memory per device in MiB; device peak = torch.cuda.max_memory_allocated on rank 0 of a fake process "
              f"group over one step, less the math libraries' workspaces (allocated once per process, shown apart); "
              f"p/m = predicted / MemTracker's split of that step; one {name}, torch {torch.__version__}")
        print(format_device_table(results))
    if args.json:
        write_atomic(args.json, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
