"""Count the collectives a planned model really runs: kind, mesh axis, bytes, and module.

``CollectiveCounter`` is a ``TorchDispatchMode``: it lets DTensor turn each op into local
ops first (it returns ``NotImplemented`` for tensor subclasses) and then sees the functional
and c10d collectives that come back. That counts what ``CommDebugMode`` counts, without
its module tracker, which fails on models that call a module twice or change a hooked
module's output in place.

Bytes follow nccl-tests (and ``cost/comm.py``): the gathered output of an all_gather, the full
input of a reduce_scatter, the buffer of an all_reduce or all_to_all.

Attribution to modules: forward collectives go to the innermost module running. For
backward, a forward hook tags each autograd node a module created (inner modules first,
so an outer module only claims what its children did not), and a collective during
backward goes to the module that tagged the node autograd is running. Gradient
reductions that ``apply_plan`` adds after accumulation go to the parameter's module.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import GroupName, ProcessGroup, _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoplan.plan.module_plan import ROOT_MODULE as ROOT
from autoplan.plan.module_plan import collective_table

_TAG = "autoplan_module"


def _ops(namespace, names):
    found = {}
    for name, kind in names.items():
        packet = getattr(namespace, name, None)
        if packet is not None:
            found[packet] = kind
    return found


_functional = torch.ops._c10d_functional
_c10d = torch.ops.c10d
COLLECTIVE_OPS = {
    **_ops(_functional, {
        "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
        "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
    }),
    **_ops(_c10d, {
        "allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_": "all_gather",
        "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
        "alltoall_base_": "all_to_all",
        # point-to-point: a pipeline's activations and gradients between stages
        "send": "send", "recv_": "recv",
    }),
    # DTensor's move of a split to another dim on a device mesh: one op whose all_to_all runs
    # below this mode, so the op itself is the collective (a CPU mesh all-gathers instead)
    **_ops(torch.ops._dtensor, {"shard_dim_alltoall": "all_to_all"}),
}


@dataclass(frozen=True, order=True)
class Collective:
    module: str
    kind: str
    axis: str
    nbytes: int


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class CollectiveCounter(TorchDispatchMode):
    """``with CollectiveCounter(model, mesh) as counter: <one training step>``; then
    ``counter.collectives`` is a Counter of ``Collective`` -> how many times it ran."""

    def __init__(self, model: nn.Module | list[nn.Module], mesh: DeviceMesh):
        """``model``: the applied model, or a rank's pipeline stage models (FQNs the whole model's)."""
        super().__init__()
        self.collectives: Counter[Collective] = Counter()
        self._axes = _axis_groups(mesh)
        self._axis_of_group: dict[str, str] = {}
        self._stack: list[str] = []
        self._boundaries: list[set] = []
        self._hooks = []
        named = [item for one in (model if isinstance(model, list) else [model]) for item in one.named_modules()]
        for fqn, module in named:
            if _is_compile_wrapper(module):
                continue  # a compiled block's wrapper: its module inside is counted as the block
            fqn = _without_compile_wrappers(fqn)
            # first, before apply_plan's own pre-hooks (parameter gathers, input layouts)
            self._hooks.append(module.register_forward_pre_hook(self._enter(fqn or ROOT), with_kwargs=True, prepend=True))
            # always: a checkpointed module's rerun in the backward stops by raising once
            # it has made the last tensor the backward needs (``apply/recompute.py``)
            self._hooks.append(module.register_forward_hook(self._leave(fqn or ROOT), always_call=True))

    def table(self) -> dict:
        """The counts as the plan stores its prediction: module -> axis -> kind -> {"count", "bytes"}."""
        return collective_table(((c.module, c.axis, c.kind, c.nbytes), n) for c, n in self.collectives.items())

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        return super().__exit__(*exc)

    def _enter(self, fqn):
        def hook(module, args, kwargs):
            self._stack.append(fqn)
            self._boundaries.append(_grad_fns((args, kwargs)))
        return hook

    def _leave(self, fqn):
        def hook(module, args, output):
            self._stack.pop()
            _tag_autograd_nodes(output, fqn, self._boundaries.pop())
        return hook

    def _current_module(self) -> str:
        if self._stack:
            return self._stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(_TAG, ROOT)  # type: ignore[attr-defined]  # a dict property; torch types it a method
        return ROOT

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor lower the op; its collectives come back here
        kind = COLLECTIVE_OPS.get(func.overloadpacket)
        if kind is not None:
            self._record(func, kind, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, kind, args, kwargs):
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        group = _group_name(args, kwargs)
        if group not in self._axis_of_group:
            self._axis_of_group[group] = _axis_of(group, self._axes)
        axis = self._axis_of_group[group]
        first = _nbytes(tensors[0]) if tensors else 0
        if kind == "all_gather":
            size = _group_size(func, args, kwargs)
            nbytes = first * size  # the gathered output
        else:
            nbytes = first
        self.collectives[Collective(self._current_module(), kind, axis, nbytes)] += 1


def _is_compile_wrapper(module: nn.Module) -> bool:
    """``torch.compile``'s module wrapper (without importing dynamo to ask)."""
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module)


def _without_compile_wrappers(fqn: str) -> str:
    """The plan's name of a module inside blocks compiled in place (``layers.0._orig_mod.mlp``)."""
    return ".".join(part for part in fqn.split(".") if part != "_orig_mod")


def _axis_names(mesh: DeviceMesh) -> tuple[str, ...]:
    names = mesh.mesh_dim_names
    return tuple(names) if names else tuple(f"axis{i}" for i in range(mesh.ndim))


def _axis_groups(mesh: DeviceMesh) -> dict[frozenset, str]:
    """This rank's group on each mesh axis, and on each run of adjacent axes (DTensor
    flattens axes to reduce over several at once), by the ranks it holds. Shorter runs
    first: where an axis of size 1 makes a run hold the same ranks as one axis (pp 1 x dp 2:
    "pp+dp" is "dp"'s group), the group is named by the one axis, as plans name it."""
    names = _axis_names(mesh)
    coordinate = mesh.get_coordinate()
    assert coordinate is not None  # this rank is in the mesh
    ranks = mesh.mesh
    groups: dict[frozenset, str] = {}
    for length in range(1, mesh.ndim + 1):
        for first in range(mesh.ndim - length + 1):
            last = first + length - 1
            index = tuple(
                slice(None) if first <= axis <= last else coordinate[axis] for axis in range(mesh.ndim)
            )
            members = frozenset(int(r) for r in ranks[index].flatten().tolist())
            groups.setdefault(members, "+".join(names[first:last + 1]))
    return groups


def _axis_of(group: str | None, axes: dict[frozenset, str]) -> str:
    if group is None:
        return "?"
    try:
        members = frozenset(dist.get_process_group_ranks(_resolve_process_group(GroupName(group))))
    except (RuntimeError, ValueError, KeyError):
        return group
    return axes.get(members, group)


def _group_name(args, kwargs) -> str | None:
    """The process group a collective runs on: functional collectives name it last among
    their string arguments (after the reduce op), c10d ops carry the ProcessGroup object."""
    values = list(args) + list(kwargs.values())
    names = [v for v in values if isinstance(v, str)]
    if names:
        return names[-1]
    group = next((v for v in values if isinstance(v, ProcessGroup)), None)
    if group is None:
        # c10d's point-to-point ops carry their group boxed, as a ScriptObject
        group = next((ProcessGroup.unbox(v) for v in values if isinstance(v, torch.ScriptObject)), None)
    return group.group_name if group is not None else None


def _group_size(func, args, kwargs) -> int:
    """Ranks an all_gather gathers from: the functional op's ``group_size`` argument, or the c10d op's group."""
    if func.namespace == "_c10d_functional":
        return int(args[1])
    return next((v.size() for v in list(args) + list(kwargs.values()) if isinstance(v, ProcessGroup)), 1)


def _grad_fns(tree) -> set:
    return {t.grad_fn for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None}


def _tag_autograd_nodes(output, fqn: str, inputs: set) -> None:
    """Claim, for ``fqn``, every autograd node behind ``output`` that no inner module has
    claimed, stopping at the nodes that made the module's inputs. The walk goes on through
    an inner module's nodes: what lies between this module's inputs and the inner one's is
    this module's (its input hook's move, read by an inner module through a view: Switch
    Transformers' sparse MLP hands its experts a view of its input)."""
    roots = list(_grad_fns(output))
    seen = set(inputs)
    inner = f"{fqn}." if fqn != ROOT else ""
    while roots:
        node = roots.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        claimed = node.metadata.get(_TAG)
        if claimed is None:
            node.metadata[_TAG] = fqn
        elif not claimed.startswith(inner):
            continue  # another module's, outside this one (a value read from elsewhere): not walked
        roots.extend(next_node for next_node, _ in node.next_functions)
