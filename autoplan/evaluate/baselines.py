"""Baseline plans, built by autoplan itself: the layouts people write by hand.

Each baseline fixes the parameter and batch placements, keeps every op's work split on
the data-parallel axis (left free, the solver would rather gather a small batch than
all-reduce the gradients, and "data parallel" would run replicated), and for the
data-parallel family keeps the other mesh axes idle; the solver then finds the cheapest
execution of that layout, as ``score`` does, and the result is an ordinary ``Plan``. A
baseline is a subset of what ``suggest`` searches (the same problem, identical layers tied
alike: ``pipeline/problem.py``), so autoplan's own plan never predicts slower than any of them.

Axis roles: the data-parallel axis is the one named ``dp`` (else axis 0), the
tensor-parallel axis the one named ``tp`` (else the last axis). Any other axis (``cp`` of
a 3-D mesh) replicates everything in every baseline.

    data_parallel   parameters R; batch dim 0 sharded on dp; every other axis idle (R).
                    autoplan shards a tensor dim on one mesh axis only, so on a 2x4 mesh the
                    batch splits 2 ways and each tp group of 4 repeats the same work.
    fsdp            as data_parallel, but each parameter sharded on dp along its first dim
                    that divides evenly (dim 0 first; FSDP2 pads dim 0 instead, which
                    DTensor plans cannot express), replicated if none does.
    megatron        torchtitan's layout on tp: q/k/v and gate/up (GPT-2's c_attn/c_fc, BERT's
                    query/key/value/intermediate) column-parallel, o/down (c_proj, BERT's
                    output.dense) row-parallel; embeddings, norms and heads replicated;
                    batch on dp, parameters replicated on dp. Activations on tp are the
                    solver's choice (sequence parallel where it pays). GPT-2's Conv1D stores
                    its weight input x output, so its column shard is dim 1, its row shard dim 0.
    megatron_fsdp   megatron on tp plus fsdp on dp: each parameter also sharded on dp along
                    its first dim that tp leaves whole and that divides evenly.
    torchtitan      torchtitan's Llama recipe: megatron_fsdp plus sequence parallel on tp.
                    The output head is split by vocabulary on tp (the token embedding is
                    not: ``_vocabulary_dims``); norms run on sequence slices; attention and
                    MLP blocks hand back sequence slices (``evaluate/sequence_parallel.py``);
                    the loss runs on the logits split by vocabulary where that is cheapest,
                    as torchtitan's loss parallel does (``dtensor/loss_parallel.py``). Fused
                    ``wqkv`` is column-parallel.
                    FSDP as FSDP2 applies it: dim 0 on dp, split again under tp's split
                    where tp splits dim 0 too (``_S(0, tp)`` on dp: DTensor's
                    _StridedShard); where dim 0 does not divide (FSDP2 pads it), the next
                    dim that does, as in megatron_fsdp.

Each recipe's activation checkpointing (``RECIPE_RECOMPUTE``), for scoring a baseline at
the batches people train with (``benchmarks/baselines.py --recompute recipe``): torchtitan
checkpoints every block ("full" by default, "selective" as an option), and so do FSDP
recipes (each wrapped block checkpointed) and plain data parallel at such batches;
Megatron-LM's recipe recomputes selectively (``--recompute-activations``).

A baseline that does not apply (no transformer projections for megatron, a 1-D mesh for
megatron_fsdp, a batch that does not divide the dp axis) raises NotApplicableError. On a
1-D mesh torchtitan is tensor and sequence parallel only.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoplan.errors import NotApplicableError
from autoplan.evaluate.projections import COLUMN_PARALLEL, ROW_PARALLEL, WEIGHT_DIMS
from autoplan.evaluate.projections import projection_role as _role
from autoplan.evaluate.score import pins_for_plan
from autoplan.evaluate.sequence_parallel import HEADS, pin_sequence_parallel
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import Problem, prepare_problem, solve_problem
from autoplan.placements import Spec, replicated, shard, strided
from autoplan.plan.module_plan import Plan
from autoplan.tree_paths import readable_path

BASELINES = ("data_parallel", "fsdp", "megatron", "megatron_fsdp", "torchtitan")
_TENSOR_PARALLEL = ("megatron", "megatron_fsdp", "torchtitan")
_FULLY_SHARDED = ("fsdp", "megatron_fsdp", "torchtitan")
RECIPE_RECOMPUTE = {
    "data_parallel": "full", "fsdp": "full", "megatron": "selective", "megatron_fsdp": "selective", "torchtitan": "full",
}
"""Per baseline: the checkpointing mode its recipe runs every repeated block with (see above)."""



@dataclass(frozen=True)
class Baseline:
    name: str
    plan: Plan
    """The cheapest execution of the layout, as a plan (predicted times included)."""
    layout: dict[str, Spec]
    """What was pinned: parameter FQNs and batch key paths -> placements."""
    notes: tuple[str, ...]
    """Where the layout departs from its description (dims that do not divide evenly)."""
    fits: bool
    """Whether it fits the per-device memory budget."""


def build_baseline(
    name: str,
    model: nn.Module,
    example_inputs,
    mesh=(2, 4),
    axis_names=("dp", "tp"),
    profile=None,
    memory_gb: float | None = None,
    loss_fn=None,
    recompute: str | None = None,
    *,
    memory_gib: float | None = None,
) -> Baseline:
    """The baseline ``name`` (one of BASELINES) for ``model`` on ``mesh``, for the training
    loss ``loss_fn(output, batch)`` (default: the model's own); ``recompute`` ("full" or
    "selective") checkpoints its repeated layers, as torchtitan's recipes do ("full").
    Its fit is judged against ``memory_gb`` (10**9 bytes) or ``memory_gib`` (2**30 bytes),
    else the profile's device memory."""
    _check_name(name)
    problem = prepare_problem(model, example_inputs, tuple(mesh), tuple(axis_names), profile, memory_gb,
                              memory_gib=memory_gib, loss_fn=loss_fn)
    return baseline_for_problem(name, problem, recompute=recompute)


def baseline_for_problem(name: str, problem: Problem, time_limit_s: float | None = None, recompute: str | None = None) -> Baseline:
    """The baseline ``name`` on a prepared problem (trace once, build every baseline);
    ``recompute``: a checkpointing mode for its repeated layers (where the problem has them)."""
    _check_name(name)
    layout, idle, notes = baseline_layout(name, problem)
    pins = Pins(problem)
    for key, spec in layout.items():
        pins.place(key, spec)
    dp = _dp_axis(problem, name)
    if name == "torchtitan":
        pinned, skipped = pin_sequence_parallel(pins, problem, dp, _tp_axis(problem), _row_parallel_modules(problem))
        if skipped:
            notes.append(f"{skipped} of {pinned + skipped} sequence-parallel boundaries cannot hold with this layout: left to the solver")
    if dp is not None:
        whole = pins.split_work(dp)  # data parallel: the batch stays split, never gathered to save a reduction
        if whole:
            ops = sorted({str(problem.choices.decision(n).fx_node.target).split(".")[1] for n in whole})
            notes.append(f"{len(whole)} ops cannot split their work on {problem.choices.axis_names[dp]} ({', '.join(ops[:6])})")
    if idle:
        names = problem.choices.axis_names
        free, stray = pins.replicate_axes(idle)
        idle_names = ", ".join(names[a] for a in idle)
        if free or stray:
            ops = sorted({str(problem.choices.decision(n).fx_node.target).split(".")[1] for n in free + stray})
            notes.append(
                f"{len(free) + len(stray)} values still split on {idle_names} ({', '.join(ops[:6])}): "
                "no strategy of theirs keeps that axis idle in the simplified problem"
            )
    held = recompute or False
    if recompute and problem.layers is None:
        notes.append(f"recompute {recompute} not applied: the model has no stack of repeated layers planned as one")
        held = False
    warnings = [f"baseline {name}", *notes]
    plan, _, _ = solve_problem(problem, pins, time_limit_s, warnings, over_budget=True, recompute=held)
    # What the plan JSON keeps is its parameter, batch and boundary layouts, not the pins
    # above (work split on dp inside modules): priced as ``score`` prices any plan, the same
    # layout may run cheaper inside its modules. The baseline is that priced plan, so that
    # scoring it gives its own prediction back.
    plan, _, fits = solve_problem(problem, pins_for_plan(problem, plan)[0], time_limit_s, warnings, over_budget=True,
                                  recompute=held)
    return Baseline(name, plan, layout, tuple(notes), fits)


def baseline_layout(name: str, problem: Problem) -> tuple[dict[str, Spec], tuple[int, ...], list[str]]:
    """(pinned placements, axes kept idle, notes) of baseline ``name``."""
    mesh = problem.choices.mesh_shape
    names = problem.choices.axis_names
    tp = _tp_axis(problem)
    uses_tp = name in _TENSOR_PARALLEL
    dp = _dp_axis(problem, name)
    uses_dp = dp is not None
    if name == "megatron_fsdp" and len(mesh) < 2:
        raise NotApplicableError(
            "megatron_fsdp needs a 2-D mesh (dp x tp)", hint="use a mesh such as 2x4, or the megatron or fsdp baseline"
        )
    active = set(((dp,) if uses_dp else ()) + ((tp,) if uses_tp else ()))
    idle = tuple(a for a in range(len(mesh)) if a not in active)
    notes: list[str] = []
    shapes = _placeholder_shapes(problem)

    layout: dict[str, Spec] = {}
    for node, key in problem.traced.inputs.items():
        spec = list(replicated(len(mesh)))
        if dp is not None:
            size = shapes[node][0] if shapes[node] else 0
            if not size or size % mesh[dp]:
                raise NotApplicableError(
                    f"{name}: batch input {readable_path(key)} of shape {list(shapes[node])} does not split evenly over the "
                    f"{names[dp]} axis of size {mesh[dp]}",
                    hint=f"use a batch size divisible by {mesh[dp]}",
                )
            spec[dp] = shard(0)
        layout[key] = tuple(spec)

    tensor_parallel = _megatron_dims(problem, mesh[tp], notes) if uses_tp else {}
    if name == "torchtitan":
        tensor_parallel.update(_vocabulary_dims(problem, mesh[tp], notes))
    if uses_tp and not tensor_parallel:
        raise NotApplicableError(
            f"{name}: no transformer projections found (modules named {', '.join(COLUMN_PARALLEL[:5])}, "
            f"{', '.join(ROW_PARALLEL[:2])}, ... of type Linear or Conv1D)",
            hint="megatron applies to transformer models; use the data_parallel or fsdp baseline",
        )
    for node, fqns in problem.traced.parameters.items():
        spec = list(replicated(len(mesh)))
        shape = shapes[node]
        if node in tensor_parallel:
            spec[tp] = shard(tensor_parallel[node])
        fsdp2 = _fsdp_over_tp(spec[tp], shape, mesh, dp, tp) if name == "torchtitan" and dp is not None and shape else None
        if fsdp2 is not None and dp is not None:
            spec[dp] = fsdp2
        elif name in _FULLY_SHARDED and dp is not None:
            taken = tensor_parallel.get(node)
            dim = next((d for d in range(len(shape)) if d != taken and shape[d] % mesh[dp] == 0), None)
            if dim is None:
                notes.append(f"{fqns[0]} {list(shape)}: no dim (that tp leaves whole) divides {mesh[dp]}, replicated on {names[dp]}")
            else:
                spec[dp] = shard(dim)
        for fqn in fqns:
            layout[fqn] = tuple(spec)
    if problem.blocks:  # the layers that were not traced are laid out as the last traced one
        layout = problem.blocks.widen(layout)
    return layout, idle, notes


def _fsdp_over_tp(on_tp: str, shape: tuple[int, ...], mesh: tuple[int, ...], dp: int, tp: int) -> str | None:
    """FSDP2's storage on dp of a parameter laid out ``on_tp`` on tp: dim 0 split on dp,
    within tp's split where tp splits dim 0 too (``_S(0, k)``, DTensor's ``_StridedShard``,
    where dp comes first on the mesh); None where dim 0 does not divide (FSDP2 pads it; a
    plan cannot)."""
    if on_tp != shard(0):
        return None if shape[0] % mesh[dp] else shard(0)
    if shape[0] % (mesh[dp] * mesh[tp]):
        return None
    return strided(0, mesh[tp]) if dp < tp else shard(0)


def _dp_axis(problem: Problem, name: str) -> int | None:
    """The axis the baseline splits the batch on, or None (a 1-D mesh is all tp for megatron)."""
    names = problem.choices.axis_names
    if name in _TENSOR_PARALLEL and len(names) == 1:
        return None
    return names.index("dp") if "dp" in names else 0


def _tp_axis(problem: Problem) -> int:
    names = problem.choices.axis_names
    return names.index("tp") if "tp" in names else len(names) - 1


def _check_name(name: str) -> None:
    if name not in BASELINES:
        raise NotApplicableError(f"unknown baseline {name!r}", hint=f"use one of {', '.join(BASELINES)}")


def _megatron_dims(problem: Problem, tp_size: int, notes: list[str]) -> dict[str, int]:
    """Parameter placeholder -> tensor dim sharded on tp, for the matched projections."""
    by_fqn = {fqn: node for node, fqns in problem.traced.parameters.items() for fqn in fqns}
    shapes = _placeholder_shapes(problem)
    dims: dict[str, int] = {}
    for module, kind in problem.traced.module_types.items():
        role = _role(module)
        if role is None or kind not in WEIGHT_DIMS:
            continue
        column_dim, row_dim = WEIGHT_DIMS[kind]
        weight = by_fqn.get(f"{module}.weight")
        bias = by_fqn.get(f"{module}.bias")
        wanted = {weight: column_dim if role == "column" else row_dim}
        if role == "column" and bias is not None:
            wanted[bias] = 0  # the output features; a row-parallel bias stays replicated
        for node, dim in wanted.items():
            if node is None:
                continue
            if shapes[node][dim] % tp_size:
                notes.append(f"{module}: dim {dim} of {list(shapes[node])} does not divide {tp_size}, replicated on tp")
                continue
            dims[node] = dim
    return dims


def _vocabulary_dims(problem: Problem, tp_size: int, notes: list[str]) -> dict[str, int]:
    """Parameter placeholder -> 0 for the output head: split by vocabulary row on tp.

    torchtitan splits the token embedding by vocabulary too; its lookup then hands back a
    masked partial sum (DTensor's ``MaskPartial``), a placement plans cannot hold, so such
    a weight would be gathered whole for every lookup. The embedding stays as in
    megatron_fsdp (replicated on tp), and a note says so."""
    by_fqn = {fqn: node for node, fqns in problem.traced.parameters.items() for fqn in fqns}
    shapes = _placeholder_shapes(problem)
    dims: dict[str, int] = {}
    for module, kind in problem.traced.module_types.items():
        if kind == "Embedding":
            notes.append(f"{module}: not split by vocabulary on tp (its masked partial output is not expressible)")
            continue
        if module.rpartition(".")[2] not in HEADS or kind != "Linear":
            continue
        node = by_fqn.get(f"{module}.weight")
        if node is None:
            continue
        if shapes[node][0] % tp_size:
            notes.append(f"{module}: {shapes[node][0]} rows do not divide {tp_size}, replicated on tp")
            continue
        dims[node] = 0
    return dims


def _row_parallel_modules(problem: Problem) -> set[str]:
    return {module for module, kind in problem.traced.module_types.items() if kind in WEIGHT_DIMS and _role(module) == "row"}


def _placeholder_shapes(problem: Problem) -> dict[str, tuple[int, ...]]:
    return {
        node.name: tuple(node.meta["val"].shape)
        for node in problem.traced.graph_module.graph.nodes
        if node.op == "placeholder"
    }
