"""``show``: a plan as people talk about it, from the plan file alone.

- the layout per module in words (``patterns.py``), repeated blocks folded;
- the predicted step time: compute, and communication per mesh axis and collective kind.
  The plan stores each step's collectives (count and bytes per axis and kind); each is
  priced here with the profile's alpha-beta cost (``cost/comm.py``: ``count x latency +
  bus factor x bytes / bus bandwidth``, exact for a sum of calls). The cost stage charged
  ``predicted.comm_s``, which the step time counts; where the two differ, the rest is one
  "other" row, so the rows add up to the prediction. Positive, it is what the cost stage
  charges beyond the table (a move priced per reader where a module boundary moves a
  value once, a shared gradient reduction). Negative, the table comes to more than the
  cost stage charged: the cost stage prices each op's planned layout, the table the
  collectives DTensor is expected to run, which can take another layout (its own choice of
  strategy for what arrives, and the moves that follow from it); the note then says by how
  much they disagree and which modules hold the table's time (repeated layers folded), so
  that a large gap is seen, not absorbed;
- the memory per device: the cost stage's split of the peak (``predicted.memory``); for
  plan files written before plans split it, model state split the way the cost stage
  counted it then (every trainable parameter's local shard four times: weights,
  gradients, AdamW's two moments), from each parameter's stored layout and global shape.
  The element size is the parameters' dtype (``Plan.parameter_dtypes``; for plan files made
  before plans recorded it, the size that makes the split add up); where the split does not
  add up to ``predicted.model_state_bytes`` (mixed dtypes, frozen parameters), it is left
  out and said so;
- the predicted MFU: model FLOPs (6 x parameters outside embedding tables x tokens, the
  usual training estimate; tokens from the 2-D batch input) over the step time times every
  device's peak for the parameters' dtype (none where the dtype is unknown), and the step
  split into those FLOPs at peak and the rest, which says why MFU is what it is
  (``step_split.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autoplan.cost.memory import STATE_COPIES_END as STATE_COPIES
from autoplan.cost.regime import regime_words  # plans made before the split counted 4 copies
from autoplan.explain.mesh_gain import gain_lines
from autoplan.explain.mfu import mfu_of, mfu_section, parameter_dtype
from autoplan.explain.patterns import ModuleRow, fold, module_rows, parameter_numel
from autoplan.explain.stages import pipeline_sections
from autoplan.pipeline.budget import budget_words
from autoplan.placements import format_spec, is_shard, shard_factor
from autoplan.plan.expert_parallel import EXPERT_NOTE, expert_notes, expert_rows
from autoplan.tree_paths import readable_path
from autoplan.units import GIB, ms, nbytes

_ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class CommRow:
    axis: str
    kind: str
    count: int
    bytes: int
    seconds: float | None
    """Priced with the profile; None where the profile could not be loaded."""


@dataclass(frozen=True)
class Memory:
    parameters: int | None
    gradients: int | None
    optimizer: int | None
    activations: int
    model_state: int
    peak: int
    budget: float | None
    """Per-device budget in bytes: the one the plan records, else the profile's device memory."""
    budget_source: str
    element_bytes: int | None
    note: str = ""
    temporaries: int | None = None
    """At the peak, from ``predicted.memory``: buffers and what is neither kept nor state (the
    backward's first gradients); None for plans written before plans split their peak."""


@dataclass(frozen=True)
class Summary:
    mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    profile: str
    rows: tuple[ModuleRow, ...]
    batch: tuple[tuple[str, str, str], ...]
    """(key path, global shape, placements) per batch input."""
    step_time_s: float
    compute_s: float
    comm_s: float
    comm: tuple[CommRow, ...]
    comm_other_s: float | None
    """``comm_s`` less the priced collectives (see the module docstring)."""
    comm_by_module: tuple[tuple[str, float], ...]
    """The priced collectives per module (repeated layers folded), most first; empty where
    not priced."""
    memory: Memory
    model_flops: float | None
    mfu: float | None
    mfu_note: str
    all_replicated: bool
    solver: str
    warnings: tuple[str, ...] = field(default=())
    one_device_s: float | None = None
    """The whole step on one device, where the planning run priced it (``mesh_gain.py``);
    a plan file alone does not say."""
    recompute: tuple[tuple[str, str], ...] = ()
    """(module, "full" or "selective") per checkpointed module, repeated blocks folded."""
    compute_split: dict = field(default_factory=dict)
    """``predicted.compute_split``: the compute by what it is made of (``step_split.py``);
    empty for plans written before plans split it."""
    regime: str = "none"
    """The compile regime the step is priced for (``cost/regime.py``)."""
    model_flops_at_peak_s: float | None = None
    """The model's FLOPs at every device's peak: MFU x step time (None where MFU is)."""
    stage_sections: tuple = ()
    """A pipelined plan's stage tables (``stages.py``); () without a pipeline."""
    attention_flops: float = 0.0
    """``Plan.attention_flops``: counted in ``model_flops`` where non-zero."""
    context: tuple[str, ...] = ()
    """The context-parallel layout in words (``context_words``); () without one."""
    experts: tuple = ()
    """(modules, axis, experts per rank, call) per expert-parallel layout (``plan/expert_parallel.expert_rows``)."""
    expert_notes: tuple[str, ...] = ()
    """What the experts' other layout costs, where ``suggest --expert-parallel`` priced it."""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["rows"] = [asdict(r) for r in self.rows]
        return data


def summarize(plan, profile=None, one_device_s: float | None = None) -> Summary:
    """The ``Summary`` of ``plan``; ``profile`` (a ClusterProfile) defaults to the plan's own,
    when it is a built-in one (else communication is shown without times, MFU left out).
    ``one_device_s``: one device's step time, where the caller priced it (``suggest``)."""
    p = plan.predicted
    cluster, note = _profile(plan, profile)
    # A pipelined plan's tables are its layout's for one microbatch (``docs/pipeline.md``), not
    # its step's: its step is priced from its stages, and its communication shown whole.
    stepwise = plan.pipeline is None
    comm = _comm_rows(plan, cluster) if stepwise else []
    priced = sum(s for r in comm if (s := r.seconds) is not None) if cluster is not None else None  # all priced
    by_module = _comm_by_module(plan, cluster) if cluster is not None and stepwise else ()
    memory = memory_split(plan, cluster)
    flops, mfu, mfu_note, at_peak = mfu_of(plan, cluster, memory.element_bytes)
    return Summary(
        mesh=tuple(plan.mesh_shape),
        axis_names=tuple(plan.axis_names),
        profile=plan.profile,
        regime=plan.regime,
        rows=tuple(module_rows(plan)),
        batch=tuple((k, str(list(b.shape)), format_spec(b.placements)) for k, b in sorted(plan.inputs.items())),
        step_time_s=p.step_time_s,
        compute_s=p.compute_s,
        comm_s=p.comm_s,
        comm=tuple(comm),
        comm_other_s=None if priced is None else p.comm_s - priced,
        comm_by_module=by_module,
        memory=memory,
        model_flops=flops,
        mfu=mfu,
        mfu_note=mfu_note or note,
        all_replicated=all_replicated(plan),
        solver=f"{plan.solver.status}, gap {plan.solver.gap:.2%}",
        warnings=tuple(w for w in plan.warnings if not w.startswith(EXPERT_NOTE)),  # in the experts' section
        experts=expert_rows(plan),
        expert_notes=expert_notes(plan),
        one_device_s=one_device_s,
        recompute=recompute_rows(plan),
        compute_split=dict(p.compute_split),
        model_flops_at_peak_s=at_peak,
        attention_flops=plan.attention_flops,
        context=context_words(plan),
        stage_sections=tuple(pipeline_sections(plan)),
    )


@dataclass(frozen=True)
class RecomputeRow:
    name: str
    mode: str
    count: int = 1

    def key(self) -> str:
        return self.mode


def recompute_rows(plan) -> tuple[tuple[str, str], ...]:
    """``Plan.recompute`` as (module, mode), consecutive blocks of one mode folded: "model.layers.0-31"."""
    rows = [RecomputeRow(fqn, mode) for fqn, mode in plan.recompute.items()]
    return tuple((row.name, row.mode) for row in fold(rows))


def all_replicated(plan) -> bool:
    """Every parameter and batch input replicated on every axis: each device runs the whole step."""
    specs = [*plan.parameters.values(), *(b.placements for b in plan.inputs.values())]
    return not any(is_shard(p) for spec in specs for p in spec)


def _profile(plan, profile):
    if profile is not None:
        return profile, ""
    from autoplan.cost.profile import load_profile
    from autoplan.errors import ProfileError

    try:
        return load_profile(plan.profile), ""
    except ProfileError:
        return None, f"profile {plan.profile!r} is not a built-in one: collectives not priced, MFU not computed"


def _comm_rows(plan, cluster) -> list[CommRow]:
    rows = []
    for axis, kinds in plan.predicted.collectives.items():
        for kind, entry in kinds.items():
            seconds = _priced(plan, cluster, axis, kind, entry) if cluster is not None else None
            rows.append(CommRow(axis, kind, int(entry["count"]), int(entry["bytes"]), seconds))
    return rows


def _priced(plan, cluster, axis: str, kind: str, entry: dict) -> float:
    """Seconds of ``entry["count"]`` calls moving ``entry["bytes"]`` in all (module docstring)."""
    from autoplan.cost.comm import calls_seconds

    axes = tuple(plan.axis_names.index(name) for name in axis.split("+"))  # "dp+tp": flattened axes
    return calls_seconds(cluster, kind, entry["count"], entry["bytes"], tuple(plan.mesh_shape), axes)


def _comm_by_module(plan, cluster) -> tuple[tuple[str, float], ...]:
    from autoplan.explain.alternatives import _folded

    seconds: dict[str, float] = {}
    for module, axes in plan.predicted.module_collectives.items():
        name = _folded(module, plan)
        for axis, kinds in axes.items():
            for kind, entry in kinds.items():
                seconds[name] = seconds.get(name, 0.0) + _priced(plan, cluster, axis, kind, entry)
    return tuple(sorted(seconds.items(), key=lambda item: -item[1]))


def local_elements(plan) -> int:
    """Parameter elements one device stores (each parameter's global size over its shard
    factor; a tied parameter once, under the name it is tied to)."""
    total = 0
    for fqn, spec in plan.parameters.items():
        if fqn in plan.tied_parameters:
            continue
        total += parameter_numel(plan, fqn) // shard_factor(tuple(spec), tuple(plan.mesh_shape))
    return total


def memory_split(plan, cluster=None) -> Memory:
    """Model state as the cost stage counts it (see the module docstring), checked to add up."""
    p = plan.predicted
    budget, source = plan.solver.memory_budget_bytes, "the budget it was planned under"
    if budget is None:
        budget, source = budget_bytes(plan), "recorded in the plan"
    if budget is None and cluster is not None:
        budget, source = float(cluster.memory_bytes), "the profile's device memory, suggest's default budget"
    elif budget is None:
        source = "none recorded"
    elements = local_elements(plan)
    recorded = _ELEMENT_BYTES.get(parameter_dtype(plan) or "")
    if p.memory:  # the cost stage's own split of the peak (gradients are none yet where the backward starts)
        at = p.memory
        return Memory(at["parameters"], at["gradients"], at["optimizer"], at["activations"], p.model_state_bytes,
                      p.peak_memory_bytes, budget, source, recorded, temporaries=at["temporaries"] + at["buffers"])
    for size in (recorded,) if recorded else (2, 4, 1, 8):
        if elements and STATE_COPIES * size * elements == p.model_state_bytes:
            weights = size * elements
            return Memory(weights, weights, 2 * weights, p.activation_bytes, p.model_state_bytes,
                          p.peak_memory_bytes, budget, source, size)
    return Memory(None, None, None, p.activation_bytes, p.model_state_bytes, p.peak_memory_bytes, budget, source, None,
                  "model state not split: no single dtype makes 4 copies of the parameters add up to it "
                  "(mixed dtypes, frozen or tied parameters)")


def peak_memory_lines(plan) -> list[str]:
    """The peak per device in words, as ``score`` and ``suggest --verbose`` print it: split
    at the peak (the parts sum to it, as ``show``'s memory table), then the model state
    over the whole step, which is more than the peak holds of it (the gradients do not
    all exist at the peak), labelled so. Plans written before plans split their peak: the
    two totals, labelled likewise."""
    m = memory_split(plan)
    p = plan.predicted
    if m.temporaries is None:
        return [
            (f"peak memory per device {nbytes(m.peak)}: activations {nbytes(m.activations)} at the peak; "
            f"model state {nbytes(m.model_state)} over the step (parameters, gradients, AdamW state), "
            "not all of it held at the peak (this plan file predates the split at the peak)")
        ]
    parts = (("parameters", m.parameters), ("gradients", m.gradients), ("optimizer state", m.optimizer),
             ("activations kept for backward", m.activations), ("temporaries and buffers", m.temporaries))
    held = (m.parameters or 0) + (m.gradients or 0) + (m.optimizer or 0)
    lines = [f"peak memory per device {nbytes(m.peak)}, split at the peak: "
             + ", ".join(f"{name} {nbytes(count)}" for name, count in parts)]
    if p.model_state_bytes != held:
        lines.append(f"model state over the whole step {nbytes(p.model_state_bytes)} (parameters, gradients, AdamW "
                     f"state), of which {nbytes(held)} is held at the peak: gradients are made during the backward, "
                     f"and {nbytes(m.gradients)} of them exist at the peak")
    return lines


def budget_bytes(plan) -> float | None:
    """The per-device budget, where the plan records one: ``suggest`` writes no budget into
    the plan file; ``score`` and the baselines name it in a warning when a layout does not fit."""
    import re

    for warning in plan.warnings:
        match = re.search(r"does not fit the ([0-9.e+]+) GiB per-device budget", warning)
        if match:
            return float(match.group(1)) * GIB
    return None


def context_words(plan) -> tuple[str, ...]:
    """The plan's context-parallel layout, and what the plan without it costs, in words."""
    layout = plan.context_parallel
    if layout is None:
        return ()
    from autoplan.units import ms

    words = [
        (f"sequence split over {layout.axis} ({layout.size} ranks) in torch's head-tail order: rank r holds "
         f"chunks r and {2 * layout.size - 1} - r of {2 * layout.size}, so causal attention's work is even"),
        "attention: keys and values all-gathered over the axis, their gradients reduce-scattered back",
        f"split inputs: {', '.join(readable_path(k) for k in layout.sequence_inputs)}",
    ]
    if layout.alternative_step_s is not None:
        words.append(f"without the sequence split the best plan predicts {ms(layout.alternative_step_s)} ms per step "
                     f"(this one {ms(plan.predicted.step_time_s)} ms)")
    return tuple(words)


def expert_section(rows: tuple, notes: tuple[str, ...]):
    """The experts' layout: split over an axis (expert parallel), and what the other layout costs."""
    from autoplan.explain.render import Section

    if not rows:
        return Section("experts: in the solved layout (not expert parallel)", notes=notes)
    return Section(
        "expert parallel (experts split over a mesh axis; tokens sent to them and back by all_to_all, priced "
        "with the router's load even)",
        ("experts module", "axis", "experts per rank", "called with"), rows, notes=notes,
    )


def show_sections(summary: Summary, source: str = "") -> list:
    """The summary as tables (``render.py``): layout, batch, step time, memory, MFU."""
    from autoplan.explain.render import Section

    s = summary
    names = s.axis_names
    mesh = "x".join(map(str, s.mesh))
    head = f"plan {source}: " if source else "plan: "
    sections = [Section(f"{head}mesh {mesh} ({', '.join(names)}), profile {s.profile}, solver {s.solver}; "
                        f"step priced for {regime_words(s.regime)}")]
    layout_rows = tuple(
        (r.name, *(_short(w) for w in r.words), r.stored, r.used or "same", r.activations or "-")
        for r in s.rows
    )
    sections.append(Section(
        "layout per module (repeated blocks folded; words per mesh axis)",
        ("module", *names, "stored", "computed with", "output"),
        layout_rows,
        notes=(*_legend(s), *_two_d_notes(s)),
    ))
    sections.append(Section(
        "batch",
        ("input", "shape", "placements", *names),
        tuple((readable_path(k), shape, spec, *(_batch_word(p) for p in spec.strip("[]").split(", "))) for k, shape, spec in s.batch),
    ))
    if s.context:
        sections.append(Section("context parallel (the sequence split over a mesh axis)", notes=s.context))
    if s.recompute:
        sections.append(Section(
            "activation checkpointing (recomputed in the backward; modules not named keep their activations)",
            ("module", "recompute"), s.recompute,
        ))
    if s.experts or s.expert_notes:
        sections.append(expert_section(s.experts, s.expert_notes))
    sections.extend(s.stage_sections)
    sections.append(time_section(s))
    sections.append(memory_section(s))
    sections.append(mfu_section(s))
    gains = gain_lines(s)
    if gains:
        sections.append(Section("what the mesh gains", notes=gains))
    if s.warnings:
        sections.append(Section("warnings", notes=s.warnings))
    return sections


_LEGEND = {
    "FSDP": "FSDP: stored sharded on that axis, gathered just before use (FSDP-style sharded storage)",
    "column-parallel": "column-parallel / row-parallel: the weight split by output / input features (Megatron)",
    "row-parallel": "column-parallel / row-parallel: the weight split by output / input features (Megatron)",
    "vocab-parallel": "vocab-parallel: the embedding table split by rows (tokens)",
    "expert-parallel": "expert-parallel: each rank holds its share of the experts",
    "column-parallel (each expert)": "column-/row-parallel (each expert): every expert's weight split by output / input features",
    "row-parallel (each expert)": "column-/row-parallel (each expert): every expert's weight split by output / input features",
    "feature-split": "feature-split: a norm's scale split with the features (hidden dim) it scales",
    "data parallel": "data parallel / sequence-parallel: a replicated weight on activations split by batch / sequence",
    "sequence-parallel": "data parallel / sequence-parallel: a replicated weight on activations split by batch / sequence",
}


def _legend(s: Summary) -> tuple[str, ...]:
    """The words the table uses, each explained once."""
    used = {_short(w) for r in s.rows for w in r.words}
    return tuple(dict.fromkeys(text for word, text in _LEGEND.items() if word in used))


def _short(word: str) -> str:
    return "FSDP" if word.startswith("FSDP") else word


def _two_d_notes(s: Summary) -> tuple[str, ...]:
    two_d = [r.name for r in s.rows if r.pattern.startswith("2-D") or "2-D sharded storage" in r.pattern]
    if not two_d:
        return ()
    shown = ", ".join(two_d[:4]) + (", ..." if len(two_d) > 4 else "")
    return (f"2-D sharded storage (every mesh axis): {shown}",)


def _batch_word(placement: str) -> str:
    from autoplan.placements import shard_dim

    dim = shard_dim(placement)
    return {None: "replicated", 0: "batch split", 1: "sequence split"}.get(dim, f"dim {dim} split")


def time_section(s: Summary):
    from autoplan.explain.render import Section

    def share(seconds):
        return "-" if seconds is None or s.step_time_s <= 0 else f"{seconds / s.step_time_s:.1%}"

    rows = [("compute", "", "", "", ms(s.compute_s), share(s.compute_s))]
    for r in s.comm:
        rows.append(("communication", r.axis, r.kind, f"{r.count} calls, {nbytes(r.bytes)}", ms(r.seconds), share(r.seconds)))
    notes = []
    if s.comm_other_s is not None and abs(s.comm_other_s) >= 5e-7:
        rows.append(("communication", "", "other", "", ms(s.comm_other_s), share(s.comm_other_s)))
        if s.comm_other_s > 0:
            notes.append(
                "other: what the cost stage charged beyond the collective table priced call by call "
                "(moves priced per reader where a module boundary moves a value once, shared gradient reductions)"
            )
        else:
            notes.append(table_above_charge(s))
    rows.append(("total", "", "", "", ms(s.step_time_s), share(s.step_time_s)))
    return Section(
        f"predicted step time {ms(s.step_time_s)} ms: compute {ms(s.compute_s)} ms, communication {ms(s.comm_s)} ms",
        ("part", "axis", "collective", "calls and bytes", "ms", "share"),
        tuple(rows),
        notes=tuple(notes),
        right=(4, 5),
    )


def table_above_charge(s: Summary) -> str:
    """The note on a negative "other" row: how far the two predictions of the step's
    communication lie apart, and where the table's time is."""
    assert s.comm_other_s is not None  # there is an "other" row
    table, gap = s.comm_s - s.comm_other_s, -s.comm_other_s
    share = f" ({gap / s.comm_s:.0%})" if s.comm_s > 0 else ""
    note = (
        f"other is negative: the plan's collective table, priced call by call, comes to {ms(table)} ms, "
        f"{ms(gap)} ms{share} more than the {ms(s.comm_s)} ms of communication the cost stage charged and the "
        f"step time counts (with the table's figure the step would take {ms(s.step_time_s + gap)} ms). The two "
        f"count the same step differently: the cost stage prices each op's planned layout, the table the "
        f"collectives expected to run, where DTensor may take another layout for what arrives "
        f"(`plan/collectives.py` lists the differences)"
    )
    if s.step_time_s > 0 and gap >= 0.01 * s.step_time_s and s.comm_by_module:
        top = ", ".join(f"{name} ({ms(seconds)} ms)" for name, seconds in s.comm_by_module[:3])
        note += f". The table's time is mostly in {top}; `autoplan verify` counts the collectives that really run"
    return note


def memory_section(s: Summary):
    from autoplan.explain.render import Section

    m = s.memory

    def share(count):
        return "-" if count is None or not m.budget else f"{count / m.budget:.1%}"

    rows = [
        ("parameters", nbytes(m.parameters), share(m.parameters)),
        ("gradients", nbytes(m.gradients), share(m.gradients)),
        ("optimizer state (AdamW)", nbytes(m.optimizer), share(m.optimizer)),
        ("activations kept for backward", nbytes(m.activations), share(m.activations)),
        ("peak per device", nbytes(m.peak), share(m.peak)),
    ]
    if m.temporaries is not None:
        rows.insert(4, ("temporaries and buffers", nbytes(m.temporaries), share(m.temporaries)))
    if m.parameters is None:
        rows.insert(0, ("model state", nbytes(m.model_state), share(m.model_state)))
    fits = "" if not m.budget else (" fits" if m.peak <= m.budget else " does NOT fit")
    budget = f"budget {budget_words(m.budget)}, {m.budget_source}:{fits}" if m.budget else f"budget: {m.budget_source}"
    notes = [budget]
    if m.note:
        notes.append(m.note)
    if m.temporaries is not None:
        title = f"peak memory per device {nbytes(m.peak)}, split at the peak"
    else:
        title = (f"peak memory per device {nbytes(m.peak)} (model state {nbytes(m.model_state)}, "
                 f"activations {nbytes(m.activations)})")
    return Section(title, ("part", "bytes", "of budget"), tuple(rows), notes=tuple(notes), right=(1, 2))
