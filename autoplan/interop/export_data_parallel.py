"""The data-parallel axis of a torch export: ``replicate`` where the plan keeps weights whole
on dp, ``fully_shard`` (FSDP2) where it stores them split.

Both are FSDP2's composable APIs (``replicate`` is ``torch.distributed._composable.replicate_with_fsdp``):
they nest, inner modules first, and each feeds its dp rank its own part of the batch.

- A subtree of modules whose parameters the plan all replicates on dp is wrapped once with
  ``replicate`` (plain data parallel: gradients all-reduced). Exactly the plan.
- A module owning a parameter the plan stores split on dp gets ``fully_shard``, with
  ``shard_placement_fn`` naming the plan's dim (FSDP2 splits dim 0 unless told). FSDP
  gathers the weight for compute: exactly the plan where the plan gathers it too
  (``parameter_uses`` R on dp); where the plan computes with the split (an embedding
  looked up by hidden slices), the difference is listed.
- A tied parameter (``Plan.tied_parameters``) is one tensor: its FSDP group is the
  modules' common ancestor.
- Where anything is fully sharded, the root is ``fully_shard`` too (FSDP2 needs one root); a
  parameter the root owns directly that the plan replicates is then sharded (listed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.placements import is_strided, shard_dim
from autoplan.plan.module_plan import Plan
from autoplan.tree_paths import fqn_within


@dataclass(frozen=True)
class DataParallelExport:
    replicate: tuple[str, ...]
    """Modules wrapped with ``replicate``, inner first ("" is the root)."""
    fully_shard: tuple[str, ...]
    """Modules wrapped with ``fully_shard``, inner first, the root last when present."""
    shard_dims: dict[str, int]
    """Parameter FQN -> the dim ``fully_shard`` splits, where not 0."""
    stored: dict[str, str]
    """Parameter FQN -> its exported placement on dp (``R``, ``S(d)`` or ``_S(0, k)``)."""
    differences: dict[str, list[str]] = field(default_factory=dict)
    """Module FQN -> what differs from the plan on dp."""


def common_ancestor(fqns) -> str:
    parts = [f.split(".") if f else [] for f in fqns]
    common: list[str] = []
    for names in zip(*parts):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def export_data_parallel(plan: Plan, dp: int, tp: int | None, tp_stored: dict[str, str]) -> DataParallelExport:
    """``tp_stored``: parameter FQN -> its exported placement on tp (for FSDP's strided split)."""
    name = plan.axis_names[dp]
    differences: dict[str, list[str]] = {}
    aliases = plan.tied_parameters
    called = set(plan.modules) | {""}  # FSDP2's hooks run on forward: only modules the step calls
    homes: dict[str, str] = {}  # parameter (not an alias) -> the module its dp wrapper goes on
    for fqn in plan.parameters:
        if fqn in aliases:
            continue
        users = [fqn] + [a for a, target in aliases.items() if target == fqn]
        homes[fqn] = _called_ancestor(common_ancestor([u.rpartition(".")[0] for u in users]), called)
    split = {fqn: shard_dim(plan.parameters[fqn][dp]) for fqn in homes}
    # every parameter under a module, by where it is held (a tied one under each of its modules)
    held = [(fqn.rpartition(".")[0], split[aliases.get(fqn, fqn)]) for fqn in plan.parameters]

    candidates = {m for m in called if any(fqn_within(owner, m) for owner, _ in held)}
    whole = {m for m in candidates if all(d is None for owner, d in held if fqn_within(owner, m))}
    replicate = sorted((m for m in whole if not any(a in whole for a in _ancestors(m))), key=_depth_first)
    sharded_homes = sorted({h for f, h in homes.items() if split[f] is not None}, key=_depth_first)
    fully = [h for h in sharded_homes if h]
    if sharded_homes:
        fully.append("")
        replicate = [m for m in replicate if m != ""]

    def covered(fqn: str) -> bool:
        return any(fqn_within(homes[fqn], m) for m in replicate)

    stored: dict[str, str] = {}
    shard_dims: dict[str, int] = {}
    for fqn, home in sorted(homes.items()):
        d = split[fqn]
        spec = plan.parameters[fqn]
        if d is None:
            stored[fqn] = "R"
            if not covered(fqn):  # its module is fully sharded with other parameters
                stored[fqn] = "S(0)"
                _note(differences, home, f"{_short(fqn, home)}: replicated on {name} in the plan; fully_shard of "
                      f"{home or '<root>'} shards it (dim 0)")
            continue
        if d:
            shard_dims[fqn] = d
        strided_under_tp = tp is not None and d == 0 and shard_dim(tp_stored.get(fqn, "R")) == 0 and dp < tp
        stored[fqn] = f"_S(0, {plan.mesh_shape[tp]})" if tp is not None and strided_under_tp else f"S({d})"
        if tp is not None and strided_under_tp and not is_strided(spec[dp]):
            _note(differences, home, f"{_short(fqn, home)}: the plan splits dim 0 on {name} before "
                  f"{plan.axis_names[tp]}; fully_shard splits each {plan.axis_names[tp]} piece")
        use = _uses(plan, fqn)
        for user, used in use.items():
            if used[dp] != "R":
                _note(differences, user.rpartition(".")[0], f"{_short(user, user.rpartition('.')[0])}: the plan computes with "
                      f"{used[dp]} on {name}; fully_shard gathers it for compute")
    for alias, target in aliases.items():
        stored[alias] = stored.get(target, "R")
    return DataParallelExport(tuple(replicate), tuple(fully), shard_dims, stored, differences)


def _uses(plan: Plan, fqn: str) -> dict:
    users = [fqn] + [a for a, t in plan.tied_parameters.items() if t == fqn]
    return {u: plan.parameter_uses.get(u, plan.parameters[fqn]) for u in users}


def _called_ancestor(module: str, called: set[str]) -> str:
    while module not in called:
        module = module.rpartition(".")[0]
    return module


def _ancestors(module: str) -> list[str]:
    if module == "":
        return []
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts))]


def _depth_first(module: str) -> tuple[int, str]:
    """Inner modules first (FSDP2 and replicate nest inside out), then by name."""
    return (-(module.count(".") + 1 if module else 0), module)


def _short(fqn: str, module: str) -> str:
    return fqn[len(module) + 1:] if module and fqn.startswith(module + ".") else fqn


def _note(differences: dict[str, list[str]], module: str, text: str) -> None:
    differences.setdefault(module, [])
    if text not in differences[module]:
        differences[module].append(text)
