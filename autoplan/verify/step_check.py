"""Verification: run one training step of a planned model and hold the plan to its word.

``verify_plan`` applies a plan, runs forward, backward and ``AdamW.step()`` under a
``CollectiveCounter`` (``verify/observe.py``), and compares the count and bytes of the
collectives that ran with those the plan predicted (``predicted.module_collectives``).
The verdict is per mesh axis and kind, summed over the step; the per-module rows show
where each one ran, and where that was another module than predicted. It runs on whatever process group is current: the
CLI sets up a fake one of the plan's world size, so any mesh verifies in one process.
With ``tensors="fake"`` (the command line's) the step runs on fake tensors at the real
shapes (``verify/fake_model.py``): no compute and no weight memory; a step that reads
tensor values runs on real tensors instead.

Bytes are rank 0's. autoplan never shards a dimension unevenly, so every rank sends the
same sizes. On a CPU mesh DTensor replaces all_to_all by an all_gather (gloo has none);
the prediction is translated likewise before comparing (not an expert-parallel module's
token exchange, which calls all_to_all itself), unless the step runs in a fake world that
moves as the devices do (``verify/fake_world.py``).
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

import autoplan as autoplan_package
from autoplan.apply.engine import apply_plan, shard_batch
from autoplan.errors import AutoplanError, StepError
from autoplan.plan.module_plan import Plan
from autoplan.trace.known_values import known_values
from autoplan.trace.loss import training_loss
from autoplan.trace.opaque import failing_module
from autoplan.verify.fake_model import DATA_DEPENDENT, fake_twin, needs_real_values
from autoplan.verify.fake_world import moves_gathered
from autoplan.verify.observe import CollectiveCounter


@dataclass(frozen=True)
class Row:
    module: str
    axis: str
    kind: str
    predicted: tuple[int, int]
    """(count, bytes)"""
    observed: tuple[int, int]

    @property
    def matches(self) -> bool:
        return self.predicted == self.observed


@dataclass(frozen=True, repr=False)
class Verification:
    """What ``verify_plan`` found. ``str()`` is the verdict in one line ("verified: 147
    collectives as predicted"); ``summary()`` the table. The module rows list every
    (module, axis, kind) predicted or observed: none for a step that runs no collective."""

    rows: tuple[Row, ...]
    """One per (module, axis, kind) predicted or observed."""
    loss: float = float("nan")
    """The loss of the counted step (fake collectives: comparable only between runs of one plan;
    NaN on fake tensors)."""
    tensors: str = "real"
    """What the step ran on: "fake" (shapes only, ``verify/fake_model.py``) or "real"."""
    fallback: str = ""
    """Why a count asked on fake tensors ran on real ones (empty when it did not)."""

    def totals(self) -> tuple[Row, ...]:
        """The rows summed over modules: one per (axis, kind). What passes or fails."""
        sums: dict[tuple[str, str], list[int]] = {}
        for row in self.rows:
            entry = sums.setdefault((row.axis, row.kind), [0, 0, 0, 0])
            for i, value in enumerate(row.predicted + row.observed):
                entry[i] += value
        return tuple(Row("(all)", axis, kind, (p, pb), (o, ob)) for (axis, kind), (p, pb, o, ob) in sorted(sums.items()))

    @property
    def mismatches(self) -> tuple[Row, ...]:
        """(axis, kind) totals whose count or bytes differ from the prediction."""
        return tuple(row for row in self.totals() if not row.matches)

    @property
    def moved(self) -> tuple[Row, ...]:
        """Module rows that differ: where the totals agree, a collective that ran in another
        module than predicted (a gradient reduced at a parent's boundary, say)."""
        return tuple(row for row in self.rows if not row.matches)

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def counts(self) -> tuple[int, int]:
        """(collectives predicted, collectives that ran) in the step, over every axis and kind."""
        totals = self.totals()
        return sum(row.predicted[0] for row in totals), sum(row.observed[0] for row in totals)

    def verdict(self) -> str:
        """One line: whether the step ran the collectives predicted, and how many."""
        predicted, observed = self.counts()
        if not self.passed:
            return (f"NOT verified: {len(self.mismatches)} of {len(self.totals())} kinds per axis differ "
                    f"({predicted} collectives predicted, {observed} ran)")
        if predicted == 0:
            return "verified: no collectives predicted and none ran"
        line = f"verified: {predicted} collective{'s' if predicted != 1 else ''} as predicted"
        if self.moved:
            line += f" ({len(self.moved)} module rows ran in another module than predicted)"
        return line

    def __str__(self) -> str:
        return self.verdict()

    def __repr__(self) -> str:
        predicted, observed = self.counts()
        return (f"Verification(passed={self.passed}, predicted={predicted} collectives, observed={observed}, "
                f"mismatched_kinds={len(self.mismatches)}, module_rows={len(self.rows)}, loss={self.loss!r})")

    def summary(self, all_rows: bool = False) -> str:
        lines = [f"{'module':<44} {'axis':<8} {'kind':<15} {'predicted':>22} {'observed':>22}"]
        for row in (self.rows if all_rows else self.moved) + self.totals():
            mark = "" if row.matches else ("   MISMATCH" if row.module == "(all)" else "   differs")
            lines.append(
                f"{row.module:<44} {row.axis:<8} {row.kind:<15} {_cell(row.predicted):>22} {_cell(row.observed):>22}{mark}"
            )
        if self.passed:
            verdict = "passed: every kind on every axis ran as often and as large as predicted"
            if self.moved:
                verdict += f" ({len(self.moved)} module rows ran in another module than predicted)"
        else:
            verdict = f"FAILED: {len(self.mismatches)} of {len(self.totals())} kinds per axis differ"
        lines.append(f"collectives: {verdict}")
        return "\n".join(lines)


def _cell(value: tuple[int, int]) -> str:
    count, nbytes = value
    return f"{count} x, {nbytes} B" if count else "-"


def verify_plan(
    model: nn.Module, batch, plan: Plan, device_mesh: DeviceMesh, loss_fn=None, compile_mode: str | None = None,
    backend: str = "inductor", tensors: str = "real", real_model: Callable[[], nn.Module] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Verification:
    """Apply ``plan`` to ``model``, run one training step on the global ``batch`` and compare
    its collectives with the plan's prediction. ``loss_fn`` is the training loss the plan
    was made for (the model file's ``compute_loss``; default: the model's own).

    ``tensors="real"`` (the default) applies the plan to ``model`` in place and runs the step
    for real. ``tensors="fake"`` (``autoplan verify``) counts on ``fake_twin(model)``
    (``verify/fake_model.py``) instead: the same step at the same shapes, no compute, no
    weight memory, ``model`` untouched (it may be on the meta device), the loss unknown
    (NaN). Where that step needs real values (a data-dependent read) it runs again on real
    tensors: on ``real_model()`` if given, else on ``model`` itself (unless on meta);
    ``Verification.fallback`` says why. ``compile_mode`` ("block" or "whole",
    ``verify/compiled.py``) always runs real tensors: the applied model runs under
    ``torch.compile`` with ``backend``, one forward and backward compile it first, uncounted,
    and the counted step follows from the same weights. ``progress(text)`` hears each stage
    as it starts."""
    say = progress or (lambda text: None)
    if tensors not in ("fake", "real"):
        raise ValueError(f"tensors must be 'fake' or 'real', got {tensors!r}")
    fallback = ""
    if tensors == "fake" and compile_mode is None:
        say("applying the plan to fake tensors at the real shapes")
        twin = fake_twin(model)
        try:
            observed, loss = _counted_step(twin, batch, plan, device_mesh, loss_fn, None, backend, say, fake=True)
        except Exception as err:  # counted again on real tensors, whose error is the one to report
            fallback = needs_real_values(err)
            if real_model is None and _on_meta(model):  # nothing real to count on
                if isinstance(err, AutoplanError):
                    raise
                raise step_error(err, twin) from err
        else:
            return _verdict(plan, device_mesh, observed, loss, "fake")
        finally:
            del twin
        say(f"counting on real tensors: {fallback}")
        model = real_model() if real_model is not None else model
    else:
        say("applying the plan")
    observed, loss = _counted_step(model, batch, plan, device_mesh, loss_fn, compile_mode, backend, say, fake=False)
    return dataclasses.replace(_verdict(plan, device_mesh, observed, loss, "real"), fallback=fallback)


def _counted_step(model, batch, plan: Plan, device_mesh: DeviceMesh, loss_fn, compile_mode, backend, say, fake: bool):
    """(The collectives of one training step of ``model`` with ``plan`` applied, its loss)."""
    apply_plan(model, plan, device_mesh, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(model.parameters())
    call = model
    try:
        if compile_mode is not None:
            from autoplan.verify.compiled import compile_model

            say(f"compiling the step ({compile_mode})")
            call = compile_model(model, compile_mode, backend)
            _step(call, batch, plan, device_mesh)
            optimizer.zero_grad(set_to_none=True)
        say("one training step on fake tensors, counting its collectives" if fake
            else "one training step on real tensors, counting its collectives")
        with CollectiveCounter(model, device_mesh) as counter, (known_values() if fake else nullcontext()):
            loss = _step(call, batch, plan, device_mesh)
            optimizer.step()
    except AutoplanError:
        raise
    except DATA_DEPENDENT:
        raise  # a value the fake step lacks: verify_plan counts again on real tensors
    except Exception as err:  # from DTensor or the model's own code, anywhere in the step
        raise step_error(err, model) from err
    return counter.table(), (float("nan") if fake else float(loss))


def _verdict(plan: Plan, device_mesh: DeviceMesh, observed: dict, loss: float, tensors: str) -> Verification:
    predicted = plan.predicted.module_collectives
    if moves_gathered(device_mesh):
        exchanges = {fqn: layout["axis"] for fqn, layout in plan.expert_parallel.items()}
        predicted = as_on_cpu(predicted, dict(zip(plan.axis_names, plan.mesh_shape)), exchanges)
    return dataclasses.replace(compare(predicted, observed), loss=loss, tensors=tensors)


def _on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _step(call, batch, plan: Plan, device_mesh: DeviceMesh) -> torch.Tensor:
    local = shard_batch(batch, plan, device_mesh)
    output = call(**local) if isinstance(local, dict) else call(*local)
    loss = training_loss(output)
    loss.backward()
    return loss.detach()


def step_error(err: Exception, model: nn.Module) -> StepError:
    """One line for a failed planned step: where (the innermost module running, or the
    backward), the exception, and what the user can change."""
    culprit = failing_module(err, model)
    names = {id(m): fqn for fqn, m in model.named_modules()}
    where = (f"module {names[id(culprit)] or '<root>'} ({type(culprit).__name__})" if culprit is not None
             else "the backward or optimizer step")
    first = _first_line(err)
    if not _raised_in_model_code(err):
        return StepError(
            f"the planned training step failed in {where}, inside torch and autoplan alone "
            f"(no line of the model's code ran into it): {type(err).__name__}: {first}",
            hint="this is autoplan's fault, not yours: rerun with --debug and report the traceback with the model "
            "file; meanwhile a larger --memory-gb shards less, or drop --compile",
        )
    return StepError(
        f"the planned training step failed in {where}: {type(err).__name__}: {first}",
        hint="that code runs on DTensors here: read host values with .full_tensor() first; "
        "for an op that cannot run sharded, raise --memory-gb so that less is sharded "
        "(--debug shows the traceback)",
    )


def _first_line(err: BaseException) -> str:
    """The message's first line, and the next where the first only introduces it
    (``torch.compile``'s "backend='inductor' raised:", whose next line is the error)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


_OWN_DIRS = tuple(os.path.dirname(os.path.abspath(str(module.__file__))) + os.sep for module in (torch, autoplan_package))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_INSTALLED = tuple({sysconfig.get_paths()[key] + os.sep for key in ("purelib", "platlib")})


def _own_file(name: str) -> bool:
    """torch's, autoplan's or Python's own (the standard library, not what is installed beside it)."""
    path = os.path.abspath(name)
    return path.startswith(_OWN_DIRS) or (path.startswith(_STDLIB) and not path.startswith(_INSTALLED))


def _raised_in_model_code(err: BaseException) -> bool:
    """Whether a frame of the model's own code (its file, or the library it comes from:
    transformers, timm, ...) lies between the step and where ``err`` was raised. A failure
    with none (the backward of a compiled graph, dynamo tracing, DTensor moving a gradient)
    is autoplan's, or torch's under autoplan, whatever its message says; one where the
    model's code ran may be that code reading a DTensor's values."""
    if type(err).__name__ == "InternalTorchDynamoError":  # dynamo's own failure, whatever it traced
        return False
    tb = err.__traceback__
    tb = tb.tb_next if tb is not None else None  # the frame that caught it: the step's own
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith("<") and not _own_file(name):  # "<eval_with_key>": code torch generated
            return True
        tb = tb.tb_next
    return False


def as_on_cpu(table: dict, axis_sizes: dict[str, int], exchanges: dict[str, str] | None = None) -> dict:
    """A prediction as DTensor runs it on a CPU mesh, where gloo has no all_to_all and
    DTensor all-gathers instead (then keeps its chunk): same count, n times the bytes.
    ``exchanges``: module -> mesh axis whose all_to_alls the module runs itself, not
    DTensor (an expert-parallel module's token exchange, ``Plan.expert_parallel``): kept."""
    exchanges = exchanges or {}
    out: dict = {}
    for module, per_axis in table.items():
        for axis, per_kind in per_axis.items():
            for kind, entry in per_kind.items():
                scale = 1
                if kind == "all_to_all" and exchanges.get(module) != axis:
                    kind, scale = "all_gather", axis_sizes[axis]
                into = out.setdefault(module, {}).setdefault(axis, {}).setdefault(kind, {"count": 0, "bytes": 0})
                into["count"] += entry["count"]
                into["bytes"] += entry["bytes"] * scale
    return out


def compare(predicted: dict, observed: dict) -> Verification:
    """Both tables are module -> axis -> kind -> {"count", "bytes"}."""
    keys = {
        (module, axis, kind)
        for table in (predicted, observed)
        for module, axes in table.items()
        for axis, kinds in axes.items()
        for kind in kinds
    }

    def cell(table, module, axis, kind) -> tuple[int, int]:
        entry = table.get(module, {}).get(axis, {}).get(kind)
        return (int(entry["count"]), int(entry["bytes"])) if entry else (0, 0)

    rows = tuple(
        Row(module, axis, kind, cell(predicted, module, axis, kind), cell(observed, module, axis, kind))
        for module, axis, kind in sorted(keys)
    )
    return Verification(rows)
