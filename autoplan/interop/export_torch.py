"""Export a plan to PyTorch's own API: ParallelStyles on the tp axis, ``fully_shard`` on dp.

``parallelize_module`` expresses tensor parallelism per module, Megatron-style: a
``ColwiseParallel`` module's output stays split on its last dim (a plain local tensor)
until a ``RowwiseParallel`` module sums it back; everything between runs on local shards.
An autoplan plan says more than that: any op's layout on any axis. The export keeps what
maps one-to-one and writes everything else as replicated (same numbers, other memory and
communication), and lists each such part, in the generated file and for the CLI:

| plan on the tp axis                                   | export                                  |
| ----------------------------------------------------- | --------------------------------------- |
| Linear weight S(0) (bias S(0) or none)                | ColwiseParallel                         |
| Linear weight S(1) (bias R or none)                   | RowwiseParallel                         |
| Embedding weight S(1) / S(0)                          | ColwiseParallel / RowwiseParallel       |
| a Colwise output S(k) that a Rowwise sibling takes    | output_layouts / input_layouts Shard(-1)|
|   as input S(k) (the Megatron pair: MLP, attention)   |   (local shards in between)             |
| any other activation layout (batch split on tp, ...)  | Replicate (listed)                      |
| a parameter stored sharded but used whole (FSDP-like) | replicated (listed)                     |
| any other sharded parameter                           | replicated (listed)                     |

On the data axis every parameter is sharded by ``fully_shard`` (FSDP2: dim 0, padded),
one group per module the plan shards on dp and one for the root; where the plan keeps a
parameter replicated on dp, or shards another dim, that is listed. Over a tp split of dim 0,
``fully_shard`` splits each tp piece (DTensor's ``_StridedShard``, ``_S(0, k)`` in a plan);
a plan that splits dim 0 on dp first (``S(0)`` on both axes, dp before tp) is listed too. Axes other than tp and
dp are not expressed.

The modules the plan recomputes (``Plan.recompute``) are checkpointed as torchtitan does it:
after tensor parallelism and before ``fully_shard``, each is replaced in its parent by
``checkpoint_wrapper(module)`` (non-reentrant; "selective" with a ``context_fn`` that keeps
matmul and attention outputs, the policy ``apply/recompute.py`` runs). The wrapper adds
``_checkpoint_wrapped_module.`` to the FQNs ``named_parameters()`` gives; its state_dict hooks
take it out of state_dict keys again.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.placements import Spec, is_strided, shard_dim
from autoplan.plan.module_plan import Plan
from autoplan.plan.recompute import KEPT_BY_SELECTIVE

LINEAR_TYPES = frozenset({"Linear", "NonDynamicallyQuantizableLinear"})
EMBEDDING_TYPES = frozenset({"Embedding"})
REPLICATE, SHARD_LAST = "Replicate()", "Shard(-1)"


@dataclass(frozen=True, slots=True)
class TorchExport:
    source: str
    """The generated Python module."""
    styles: dict[str, str]
    """Module FQN -> ParallelStyle expression, on the tp axis."""
    fsdp_modules: tuple[str, ...]
    """Modules wrapped with ``fully_shard`` on the dp axis, the root ("") last."""
    not_expressed: tuple[str, ...]
    """One line per part of the plan the export does not reproduce."""
    tp_axis: str | None
    dp_axis: str | None


def export_torch(plan: Plan, source_name: str = "plan.json") -> TorchExport:
    """The plan as ``parallelize_module`` styles plus ``fully_shard`` calls; see the module docstring."""
    tp, dp = _axes(plan)
    notes: list[str] = []
    details: list[str] = []  # one line per activation layout the export changes
    styles: dict[str, str] = {}
    if tp is not None:
        styles = _tensor_parallel(plan, plan.axis_names.index(tp), notes, details)
    fsdp: tuple[str, ...] = ()
    if dp is not None:
        fsdp = _data_parallel(plan, plan.axis_names.index(dp), notes, plan.axis_names.index(tp) if tp is not None else None)
    for i, axis in enumerate(plan.axis_names):
        if axis not in (tp, dp) and _any_split(plan, i):
            notes.append(f"axis {axis}: the plan splits tensors on it; only a tp and a dp axis are exported (it is left idle)")
    source = _render(plan, source_name, tp, dp, styles, fsdp, notes, details)
    return TorchExport(source, styles, fsdp, tuple(notes), tp, dp)


def _axes(plan: Plan) -> tuple[str | None, str | None]:
    names = plan.axis_names
    tp = "tp" if "tp" in names else None
    dp = "dp" if "dp" in names else None
    if tp is None and dp is None:  # unnamed axes: a 1-D mesh is tp, a larger one dp x ... x tp
        tp = names[-1]
        dp = names[0] if len(names) > 1 else None
    return tp, dp


def _split(spec: Spec, axis: int) -> int | None:
    """The tensor dim ``spec`` splits on ``axis``, or None."""
    p = spec[axis]
    return shard_dim(p)


def _any_split(plan: Plan, axis: int) -> bool:
    specs = list(plan.parameters.values()) + [b.placements for b in plan.inputs.values()]
    specs += [s for layout in plan.modules.values() for s in (*layout.inputs.values(), *layout.outputs.values())]
    return any(spec[axis] != "R" for spec in specs)


def _owners(plan: Plan) -> dict[str, dict[str, str]]:
    owners: dict[str, dict[str, str]] = {}
    for fqn in plan.parameters:
        owner, _, name = fqn.rpartition(".")
        owners.setdefault(owner, {})[name] = fqn
    return owners


def _tensor_parallel(plan: Plan, axis: int, notes: list[str], details: list[str]) -> dict[str, str]:
    name = plan.axis_names[axis]
    kinds: dict[str, str] = {}  # module -> "colwise" | "rowwise"
    for owner, params in sorted(_owners(plan).items()):
        used = {}
        for pname, fqn in params.items():
            stored = plan.parameters[fqn]
            use = plan.parameter_uses.get(fqn, stored)
            if stored[axis] != use[axis]:
                notes.append(f"{fqn}: stored {stored[axis]} on {name} and gathered to {use[axis]} for use "
                    f"(FSDP-style); exported as {use[axis]}")
            used[pname] = _split(use, axis)
        if all(d is None for d in used.values()):
            continue
        kind = _style_kind(plan.module_types.get(owner, "?"), used)
        if kind is None:
            layout = ", ".join(f"{p} {'R' if d is None else f'S({d})'}" for p, d in sorted(used.items()))
            notes.append(f"{owner or '<root>'} ({plan.module_types.get(owner, 'unknown type')}): {layout} on "
                f"{name} has no ParallelStyle; exported replicated")
            continue
        kinds[owner] = kind

    paired = _megatron_pairs(plan, kinds, axis)
    styles = {}
    for owner, kind in kinds.items():
        if kind == "colwise":
            out = SHARD_LAST if owner in paired else REPLICATE
            styles[owner] = f"ColwiseParallel(input_layouts={REPLICATE}, output_layouts={out})"
        else:
            into = SHARD_LAST if owner in paired else REPLICATE
            styles[owner] = f"RowwiseParallel(input_layouts={into}, output_layouts={REPLICATE})"
    _note_activations(plan, axis, paired, kinds, notes, details)
    return styles


def _style_kind(module_type: str, dims: dict[str, int | None]) -> str | None:
    weight, bias = dims.get("weight"), dims.get("bias")
    if set(dims) - {"weight", "bias"}:
        return None
    if module_type in LINEAR_TYPES:
        if weight == 0 and bias in (0,) + ((None,) if "bias" not in dims else ()):
            return "colwise"
        if weight == 1 and bias is None:
            return "rowwise"
    if module_type in EMBEDDING_TYPES and "bias" not in dims:
        return {1: "colwise", 0: "rowwise"}.get(weight) if weight is not None else None
    return None


def _first_input(plan: Plan, fqn: str) -> Spec | None:
    layout = plan.modules.get(fqn)
    return layout.inputs.get("[0][0]") if layout else None


def _output(plan: Plan, fqn: str) -> Spec | None:
    layout = plan.modules.get(fqn)
    return layout.outputs.get("") if layout else None


def _megatron_pairs(plan: Plan, kinds: dict[str, str], axis: int) -> set[str]:
    """Colwise/Rowwise siblings that hand a tensor split on the same dim k > 0 to each other."""
    paired: set[str] = set()
    for col, kind in kinds.items():
        if kind != "colwise" or plan.module_types.get(col) not in LINEAR_TYPES:
            continue
        out = _output(plan, col)
        k = _split(out, axis) if out else None
        if not k:
            continue
        parent = col.rpartition(".")[0]
        for row, other in kinds.items():
            into = _first_input(plan, row)
            if other == "rowwise" and row.rpartition(".")[0] == parent and into and _split(into, axis) == k:
                paired.update((col, row))
    return paired


def _note_activations(plan: Plan, axis: int, paired: set[str], kinds: dict[str, str], notes: list[str], details: list[str]) -> None:
    """List module boundaries whose layout on ``axis`` the export replaces by Replicate."""
    name = plan.axis_names[axis]
    # parent module -> the dim its Colwise/Rowwise pair hands over split
    regions = {
        fqn.rpartition(".")[0]: _split(out, axis) if (out := _output(plan, fqn)) else None  # a paired colwise has one
        for fqn in paired if kinds[fqn] == "colwise"
    }
    changed = []
    for fqn, layout in sorted(plan.modules.items()):
        parent = fqn.rpartition(".")[0]
        for side, layouts in (("input", layout.inputs), ("output", layout.outputs)):
            for key, spec in sorted(layouts.items()):
                if spec[axis] == "R":
                    continue
                if fqn not in kinds and parent in regions and _split(spec, axis) == regions[parent]:
                    continue  # e.g. the activation between the pair: local shards there too
                if fqn in paired and ((side == "output" and kinds[fqn] == "colwise")
                                      or (side == "input" and kinds[fqn] == "rowwise" and key == "[0][0]")):
                    continue
                changed.append(f"{fqn or '<root>'} {side} {key or '<output>'} {spec[axis]}")
    if changed:
        modules = sorted({line.split(" ")[0] for line in changed})
        notes.append(
            f"{len(changed)} activation layouts the plan splits on {name}, at the boundaries of {len(modules)} modules, "
            f"are exported as Replicate (ParallelStyles keep activations whole outside Colwise/Rowwise pairs); "
            f"the generated file lists them"
        )
        details.extend(f"{line} -> Replicate()" for line in changed)
    batch = [f"{key} {b.placements[axis]}" for key, b in sorted(plan.inputs.items()) if b.placements[axis] != "R"]
    if batch:
        notes.append(f"the plan splits the batch on {name} ({'; '.join(batch)}); the export feeds every {name} rank the whole batch")


def _data_parallel(plan: Plan, axis: int, notes: list[str], tp: int | None) -> tuple[str, ...]:
    name = plan.axis_names[axis]
    groups = []
    replicated = []
    for owner, params in sorted(_owners(plan).items()):
        dims = {fqn: _split(plan.parameters[fqn], axis) for fqn in params.values()}
        if any(d is not None for d in dims.values()) and owner:
            groups.append(owner)
        for fqn, d in sorted(dims.items()):
            if d is None:
                replicated.append(fqn)
            elif d != 0:
                notes.append(f"{fqn}: the plan splits dim {d} on {name}; fully_shard splits dim 0")
            elif tp is not None and axis < tp and _split(plan.parameters[fqn], tp) == 0 and not is_strided(plan.parameters[fqn][axis]):
                # fully_shard over a tp split of dim 0 splits each tp piece (``_S(0, k)``)
                notes.append(f"{fqn}: the plan splits dim 0 on {name} before {plan.axis_names[tp]} splits it; "
                             f"fully_shard splits it within each {plan.axis_names[tp]} piece")
    if replicated:
        notes.append(f"{len(replicated)} parameters the plan replicates on {name} are sharded by fully_shard all "
            f"the same: {', '.join(replicated)}")
    batch = [f"{key} {b.placements[axis]}" for key, b in sorted(plan.inputs.items()) if b.placements[axis] not in ("S(0)",)]
    if batch:
        notes.append(f"the plan does not split these batch inputs on dim 0 over {name} ({'; '.join(batch)}); FSDP "
            f"feeds each {name} rank its own batch")
    return tuple(groups) + ("",)


def _recompute_source(recompute: dict[str, str]) -> list[str]:
    saved = ", ".join(f"torch.ops.aten.{op.__name__.split('.')[0]}.default" for op in sorted(KEPT_BY_SELECTIVE, key=str))
    return [
        "RECOMPUTE = {",
        *(f"    {fqn!r}: {mode!r}," for fqn, mode in sorted(recompute.items())),
        "}",
        '"""Modules checkpointed (activation checkpointing): "full" keeps nothing, "selective" keeps matmul and attention',
        'outputs. Each runs again in the backward: it must not change state its rerun reads."""',
        "",
        f"SAVED_BY_SELECTIVE = {{{saved}}}",
        "",
        "",
        "def _keep_matmuls_and_attention(ctx, func, *args, **kwargs):",
        "    return CheckpointPolicy.MUST_SAVE if func in SAVED_BY_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE",
        "",
        "",
        "def _selective_contexts():",
        "    return create_selective_checkpoint_contexts(_keep_matmuls_and_attention)",
        "",
        "",
        "def apply_recompute(model):",
        '    """Wrap each module RECOMPUTE names in checkpoint_wrapper (non-reentrant), in place in its parent."""',
        "    for fqn, mode in RECOMPUTE.items():",
        '        parent, _, name = fqn.rpartition(".")',
        "        parent = _submodule(model, parent)",
        '        options = {"context_fn": _selective_contexts} if mode == "selective" else {}',
        "        parent.register_module(name, checkpoint_wrapper(getattr(parent, name), **options))",
        "    config = getattr(model, 'config', None)",
        "    if RECOMPUTE and getattr(config, 'use_cache', False):",
        "        # a rerun would write HF's key/value cache again; HF's own gradient checkpointing turns it off too",
        "        config.use_cache = False",
        "",
        "",
    ]


def _render(plan: Plan, source_name: str, tp, dp, styles, fsdp, notes: list[str], details: list[str]) -> str:
    mesh = "x".join(map(str, plan.mesh_shape))
    lines = [
        f'"""Generated by `autoplan export --format torch` from {source_name} (mesh {mesh}, axes {", ".join(plan.axis_names)}).',
        "",
        "    model = parallelize(model, device_mesh)   # device_mesh: init_device_mesh(..., mesh_dim_names=AXIS_NAMES)",
        "",
        f"Tensor parallel on {tp!r} with parallelize_module; data parallel on {dp!r} with fully_shard."
        if dp else f"Tensor parallel on {tp!r} with parallelize_module.",
        '"""',
        "",
    ]
    if notes:
        lines.append("# Not expressed as in the plan (numerics unchanged; memory and communication differ):")
        for note in notes:
            lines.append("#   - " + note)
        if details:
            lines.append(f"# Activation layouts on {tp} the export changes (module, input/output, key path, plan layout):")
            lines += [f"#   {line}" for line in details]
        lines.append("")
    lines += [
        "from torch.distributed.tensor import Replicate, Shard",
        "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module",
    ]
    if dp:
        lines.append("from torch.distributed.fsdp import fully_shard")
    if plan.recompute:
        lines += [
            "import torch",
            "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper",
            "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts",
        ]
    lines += [
        "",
        f"AXIS_NAMES = {tuple(plan.axis_names)!r}",
        f"MESH_SHAPE = {tuple(plan.mesh_shape)!r}",
        f"TP_AXIS = {tp!r}",
        f"DP_AXIS = {dp!r}",
        "",
        "TP_PLAN = {",
        *(f"    {fqn!r}: {style}," for fqn, style in sorted(styles.items())),
        "}",
        "",
        f"FSDP_MODULES = {tuple(fsdp)!r}",
        '"""Modules wrapped with fully_shard on DP_AXIS, inner first; "" is the root."""',
        "",
        f"NOT_EXPRESSED = {tuple(notes)!r}",
        "",
        "",
        *(_recompute_source(plan.recompute) if plan.recompute else []),
        "def parallelize(model, device_mesh):",
        '    """Apply the plan to ``model`` in place on ``device_mesh``; returns ``model``."""',
        "    if TP_AXIS is not None and TP_PLAN:",
        "        tp_mesh = device_mesh[TP_AXIS] if device_mesh.ndim > 1 else device_mesh",
        "        parallelize_module(model, tp_mesh, TP_PLAN)",
    ]
    if plan.recompute:
        lines.append("    apply_recompute(model)")
    if dp:
        lines += [
            "    if DP_AXIS is not None:",
            "        dp_mesh = device_mesh[DP_AXIS] if device_mesh.ndim > 1 else device_mesh",
            "        for fqn in FSDP_MODULES:",
            "            fully_shard(_submodule(model, fqn), mesh=dp_mesh)"
            if plan.recompute else "            fully_shard(model.get_submodule(fqn) if fqn else model, mesh=dp_mesh)",
        ]
    lines.append("    return model")
    if plan.recompute:
        lines += _RECOMPUTE_HELPERS
    return "\n".join(lines) + "\n"


_RECOMPUTE_HELPERS = [
    "",
    "",
    "def _submodule(model, fqn):",
    '    """The module at ``fqn``; a checkpoint_wrapper in the way hands attribute lookups to its module."""',
    "    for name in filter(None, fqn.split(\".\")):",
    "        model = getattr(model, name)",
    "    return model",
]
