"""Export a plan to PyTorch's own API: ParallelStyles on the tp axis, ``replicate`` / ``fully_shard`` on dp.

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
| a parameter stored sharded but used whole (FSDP-like) | replicated (listed); tied: its storage  |
| any other sharded parameter                           | replicated (listed)                     |

On the data axis (``export_data_parallel.py``) parameters the plan replicates are wrapped
with ``replicate`` and parameters it stores split with ``fully_shard`` on the plan's dim;
where the plan computes with a dp split, that is listed. Axes other than tp and dp are not
expressed. A tied parameter (``Plan.tied_parameters``) takes the style its storage calls
for in every module that holds it, and is tied again after ``parallelize_module``
(which gives each module its own copy).

What the export writes is a layout too: ``export_layout.py`` turns it back into a plan
and scores it beside the plan, per module what differs.

The modules the plan recomputes (``Plan.recompute``) are checkpointed as torchtitan does it:
after tensor parallelism and before ``replicate`` / ``fully_shard``, each is replaced in its parent by
``checkpoint_wrapper(module)`` (non-reentrant; "selective" with a ``context_fn`` that keeps
matmul and attention outputs, the policy ``apply/recompute.py`` runs). The wrapper adds
``_checkpoint_wrapped_module.`` to the FQNs ``named_parameters()`` gives; its state_dict hooks
take it out of state_dict keys again.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.interop.export_data_parallel import export_data_parallel
from autoplan.interop.export_render import render_torch
from autoplan.interop.export_result import TorchExport
from autoplan.placements import Spec, shard_dim
from autoplan.plan.module_plan import Plan
from autoplan.tree_paths import readable_path

LINEAR_TYPES = frozenset({"Linear", "NonDynamicallyQuantizableLinear"})
EMBEDDING_TYPES = frozenset({"Embedding"})
REPLICATE, SHARD_LAST = "Replicate()", "Shard(-1)"


def export_torch(plan: Plan, source_name: str = "plan.json") -> TorchExport:
    """The plan as ``parallelize_module`` styles plus ``fully_shard`` calls; see the module docstring."""
    tp, dp = _axes(plan)
    notes: list[str] = []
    details: list[str] = []  # one line per activation layout the export changes
    differences: dict[str, list[str]] = {}
    styles: dict[str, str] = {}
    changed: list[tuple[str, str, str]] = []
    tp_index = plan.axis_names.index(tp) if tp is not None else None
    if tp_index is not None:
        styles = _tensor_parallel(plan, tp_index, notes, details, changed, differences)
    tp_stored = _stored_on_tp(plan, styles)
    data_parallel = None
    if dp is not None:
        data_parallel = export_data_parallel(plan, plan.axis_names.index(dp), tp_index, tp_stored)
        for module, lines in data_parallel.differences.items():
            differences.setdefault(module, []).extend(lines)
        _note_batch_on_dp(plan, plan.axis_names.index(dp), notes, differences)
    for i, axis in enumerate(plan.axis_names):
        if axis not in (tp, dp) and _any_split(plan, i):
            notes.append(f"axis {axis}: the plan splits tensors on it; only a tp and a dp axis are exported (it is left idle)")
            differences.setdefault("", []).append(f"axis {axis} left idle")
    fsdp = data_parallel.fully_shard if data_parallel else ()
    if data_parallel and differences:
        dp_modules = sorted(data_parallel.differences)
        if dp_modules:
            notes.append(f"on {dp}: {len(dp_modules)} modules differ from the plan (replicate / fully_shard); "
                         f"the generated file lists them")
    frozen = {m: tuple(lines) for m, lines in sorted(differences.items())}
    export = TorchExport("", styles, fsdp, tuple(notes), tp, dp, data_parallel, tp_stored, tuple(changed), frozen, tuple(details))
    return replace(export, source=render_torch(plan, export, source_name))


def _stored_on_tp(plan: Plan, styles: dict[str, str]) -> dict[str, str]:
    """Each parameter's placement on tp once ``parallelize_module`` has run the styles."""
    stored = {}
    for fqn in plan.parameters:
        owner, _, name = fqn.rpartition(".")
        style = styles.get(owner, "")
        kind = "colwise" if style.startswith("Colwise") else "rowwise" if style.startswith("Rowwise") else None
        dim = None
        if kind and plan.module_types.get(owner) in EMBEDDING_TYPES:
            dim = {"colwise": 1, "rowwise": 0}[kind] if name == "weight" else None
        elif kind:
            dim = {("colwise", "weight"): 0, ("colwise", "bias"): 0, ("rowwise", "weight"): 1}.get((kind, name))
        stored[fqn] = "R" if dim is None else f"S({dim})"
    for alias, target in plan.tied_parameters.items():
        stored[alias] = stored.get(target, stored.get(alias, "R"))
    return stored


def _note_batch_on_dp(plan: Plan, axis: int, notes: list[str], differences: dict[str, list[str]]) -> None:
    name = plan.axis_names[axis]
    batch = [f"{readable_path(key)} {b.placements[axis]}" for key, b in sorted(plan.inputs.items()) if b.placements[axis] not in ("S(0)",)]
    if batch:
        notes.append(f"the plan does not split these batch inputs on dim 0 over {name} ({'; '.join(batch)}); "
                     f"replicate / fully_shard feed each {name} rank its own batch")
        differences.setdefault("", []).append(f"batch {'; '.join(batch)} on {name}; exported split by sample (S(0))")


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


def _tensor_parallel(plan: Plan, axis: int, notes: list[str], details: list[str], changed: list, differences: dict) -> dict[str, str]:
    name = plan.axis_names[axis]
    kinds: dict[str, str] = {}  # module -> "colwise" | "rowwise"
    tied = set(plan.tied_parameters) | set(plan.tied_parameters.values())
    for owner, params in sorted(_owners(plan).items()):
        used = {}
        for pname, fqn in params.items():
            stored = plan.parameters[fqn]
            use = plan.parameter_uses.get(fqn, stored)
            if fqn in tied and stored[axis] != "R":
                # one tensor in several modules: each style must hold it as it is stored
                used[pname] = _split(stored, axis)
                if stored[axis] != use[axis]:
                    differences.setdefault(owner, []).append(
                        f"{pname}: the plan gathers it to {use[axis]} on {name} for use; the style computes on its {stored[axis]} shards")
                continue
            if stored[axis] != use[axis]:
                notes.append(f"{fqn}: stored {stored[axis]} on {name} and gathered to {use[axis]} for use (FSDP-style); "
                             f"exported as {use[axis]}")
                differences.setdefault(owner, []).append(
                    f"{pname}: stored {stored[axis]} on {name} in the plan (gathered for use); exported {use[axis]}")
            used[pname] = _split(use, axis)
        if all(d is None for d in used.values()):
            continue
        kind = _style_kind(plan.module_types.get(owner, "?"), used)
        if kind is None:
            layout = ", ".join(f"{p} {'R' if d is None else f'S({d})'}" for p, d in sorted(used.items()))
            notes.append(f"{owner or '<root>'} ({plan.module_types.get(owner, 'unknown type')}): {layout} on {name} "
                         "has no ParallelStyle; exported replicated")
            differences.setdefault(owner, []).append(f"{layout} on {name}: no ParallelStyle; exported replicated")
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
    _note_activations(plan, axis, paired, kinds, notes, details, changed, differences)
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


def _note_activations(plan: Plan, axis: int, paired: set[str], kinds: dict[str, str], notes: list[str], details: list[str],
                      changed_keys: list, differences: dict) -> None:
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
                changed_keys.append((fqn, side, key))
                differences.setdefault(fqn, []).append(f"{side} {key or '<output>'} {spec[axis]} on {name}; exported Replicate")
    if changed:
        modules = sorted({line.split(" ")[0] for line in changed})
        notes.append(
            f"{len(changed)} activation layouts the plan splits on {name}, at the boundaries of {len(modules)} modules, "
            f"are exported as Replicate (ParallelStyles keep activations whole outside Colwise/Rowwise pairs); "
            f"the generated file lists them"
        )
        details.extend(f"{line} -> Replicate()" for line in changed)
    batch = [f"{readable_path(key)} {b.placements[axis]}" for key, b in sorted(plan.inputs.items()) if b.placements[axis] != "R"]
    if batch:
        notes.append(f"the plan splits the batch on {name} ({'; '.join(batch)}); the export feeds every {name} rank the whole batch")
        differences.setdefault("", []).append(f"batch {'; '.join(batch)} on {name}; exported whole")
