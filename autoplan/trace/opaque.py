"""Data-dependent regions: modules whose shapes depend on tensor values, traced as one op.

Mixture-of-experts layers find each expert's tokens with ``nonzero``/``where`` and loop
over the experts that got any; on fake tensors such code cannot be traced (the sizes are
unknown). autoplan then treats the innermost module where tracing failed, and every
module of the same class, as an *opaque region*: the traced graph holds one
``autoplan::opaque_region`` op per call, fed the call's tensors and the module's
parameters and buffers, and the planner runs it replicated (inputs gathered, every rank
computing the whole region) since it cannot look inside. The apply engine does exactly
that at run time (``apply/engine.py``), so results stay exact.

To learn the region's output shapes and FLOPs on fake tensors, its forward runs once
under ``_DataDependentHints``: ``nonzero`` answers with its largest possible size (every
element selected) and a tensor's truth value or ``.item()`` answers zero, unless the fake
tensors know it (a constant, such as sizes divided); so does a value read from a tensor
before the region and handed to it (an unbacked symbol). A split by such sizes gives its
first piece what the answered sizes leave. The shapes of
what the region returns do not depend on these answers (a MoE block returns one row per
token); its FLOPs then count every token at every expert, an upper bound the plan's
warning states.

A module that restrides a tensor (``as_strided``; torch's own ``adaptive_avg_pool2d`` does
so to a channels-last input pooled to one element, which Swin's pooler hands it) runs as
an opaque region too: DTensor has no layout in which to run it, forward or backward.

A module whose forward takes the local shards of its own DTensor parameters
(``self.w1.to_local()``: torchtitan's grouped experts, written for the expert- and
tensor-parallel layout torchtitan gives them) computes on whatever shard it holds, so no
layout but whole parameters gives its result; it is an opaque region from the start
(``takes_local_shards``), read from its class's source, since a trace on plain tensors
never takes that branch.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten

_LIBRARY = torch.library.Library("autoplan", "DEF")
_LIBRARY.define("opaque_region(str key, Tensor[] tensors) -> Tensor[]")
OPAQUE_OP = torch.ops.autoplan.opaque_region.default

DATA_DEPENDENT_ERRORS = (
    "GuardOnDataDependentSymNode",
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "UserError",
)


@dataclass
class Region:
    """One opaque module, as the trace sees it."""

    module: nn.Module
    fqn: str
    state_names: tuple[str, ...]
    """The module's parameter and buffer names, in the order they follow the inputs."""
    in_spec: TreeSpec | None = None
    in_constants: list = field(default_factory=list)
    out_spec: object = None
    out_constants: list = field(default_factory=list)
    flops: float = 0.0
    original_forward: Callable[..., Any] | None = None


_REGIONS: dict[str, Region] = {}


_OWN_LOCAL_SHARD = re.compile(r"self\.\w+\.to_local\(")
DATA_DEPENDENT, LOCAL_SHARDS = "has data-dependent shapes", "takes local shards of its own DTensor parameters"
EXPERTS = "is an experts module, planned as one region: its experts split over a mesh axis (expert parallel) or whole"
"""An experts module traced as one region on purpose (``trace/experts.py``; ``suggest --expert-parallel``):
not opaque to the planner, which lays it out as ``choices/expert_layouts.py`` offers."""
RESTRIDES = "restrides a tensor (as_strided), which DTensor runs in no layout"
"""Why a module is an opaque region, as the plan's warning says it."""
RESTRIDING_OPS = frozenset({aten.as_strided.default, aten.as_strided_.default})
"""Ops that give a tensor strides of the caller's choosing: DTensor refuses them unless they
change nothing (its ``as_strided`` handler), and their backward restrides the gradient."""


def takes_local_shards(cls: type[nn.Module]) -> bool:
    """Whether ``cls.forward`` calls ``to_local()`` on one of its module's own attributes."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):  # built in, or defined where no source is kept
        return False
    return bool(_OWN_LOCAL_SHARD.search(source))


def region(key: str) -> Region:
    return _REGIONS[key]


def region_flops(key: str) -> float:
    """FLOPs of the region's last traced call (an upper bound, see the module docstring)."""
    return _REGIONS[key].flops


@torch.library.impl(_LIBRARY, "opaque_region", "CompositeExplicitAutograd")
def _eager(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return _run(_REGIONS[key], tensors, hints=False)


@torch.library.register_fake("autoplan::opaque_region")
def _fake(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return _run(_REGIONS[key], tensors, hints=True)


def _run(region: Region, tensors: list[torch.Tensor], hints: bool) -> list[torch.Tensor]:
    n_state = len(region.state_names)
    inputs, state = list(tensors[: len(tensors) - n_state]), tensors[len(tensors) - n_state:]
    assert region.in_spec is not None and region.original_forward is not None  # set by install and the traced call
    leaves = list(region.in_constants)
    tensor_iter = iter(inputs)
    leaves = [next(tensor_iter) if leaf is _TENSOR else leaf for leaf in leaves]
    if hints:
        leaves = [_unbacked_as_zero(leaf) for leaf in leaves]
    args, kwargs = tree_unflatten(leaves, region.in_spec)
    counter = FlopCounterMode(display=False)
    with _reparametrize_module(region.module, dict(zip(region.state_names, state))), counter:
        if hints:
            with _DataDependentHints():
                output = region.original_forward(*args, **kwargs)
        else:
            output = region.original_forward(*args, **kwargs)
    region.flops = float(counter.get_total_flops())
    out_leaves, region.out_spec = tree_flatten(output)
    region.out_constants = [_TENSOR if isinstance(x, torch.Tensor) else x for x in out_leaves]
    # A custom op's outputs may not alias its inputs.
    return [x.clone() for x in out_leaves if isinstance(x, torch.Tensor)]


def _unbacked_as_zero(value):
    """A value read from a tensor before the region (Longformer's encoder asks
    ``any().item()`` whether a token attends globally) as the hints answer it: zero."""
    if isinstance(value, (torch.SymBool, torch.SymInt, torch.SymFloat)) and not value.node.has_hint():
        return {torch.SymBool: False, torch.SymInt: 0, torch.SymFloat: 0.0}[type(value)]
    return value


class _TensorSlot:
    def __repr__(self):
        return "<tensor>"


_TENSOR = _TensorSlot()


_VALUE_OPS = frozenset({aten.is_nonzero.default, aten.item.default, aten._local_scalar_dense.default})


class _DataDependentHints(TorchDispatchMode):
    """Concrete answers for value-dependent ops, so a region's forward runs on fake tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _only_plain_tensors(args, kwargs):
            # A tensor the region builds from Python data (a cache's first keys,
            # ``torch.tensor([])``) is a plain meta tensor, and ``torch.tensor`` detaches it
            # in place, which the fake mode refuses on a tensor not its own; make_fx lets
            # such a tensor be outside a region. Its ops run on the meta device as they are.
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is aten.nonzero.default:
            source = args[0]
            return torch.empty((source.numel(), source.dim()), dtype=torch.long, device=source.device)
        if func is aten.where.default:  # where(condition): nonzero as a tuple of index vectors
            source = args[0]
            return tuple(torch.empty(source.numel(), dtype=torch.long, device=source.device) for _ in range(source.dim()))
        if func in _VALUE_OPS:
            if getattr(args[0], "constant", None) is not None:
                # The fake mode knows this value (sizes divided, Longformer's chunk count).
                return func(*args, **kwargs)
            return False if func is aten.is_nonzero.default else 0
        if func is aten.split_with_sizes.default:
            args = _sizes_summing_to_the_dim(*args, **kwargs)
            kwargs = {}
        return func(*args, **kwargs)


def _only_plain_tensors(args, kwargs) -> bool:
    """Whether the op reads tensors and none of them is a fake one."""
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    return bool(tensors) and not any(isinstance(x, FakeTensor) for x in tensors)


def _sizes_summing_to_the_dim(source, sizes, dim=0):
    """A split by sizes read from tensor values (JetMoE's tokens per expert, a ``tolist()``
    before its experts' module), answered zero, sums to less than the dim: the first piece
    takes the rest. Every row is computed once, as every routed token is by one expert; a
    model's own split always sums (it fails on any device otherwise), so only answered
    sizes change."""
    sizes, length = list(sizes), source.shape[dim]
    missing = length - sum(sizes)
    if sizes and missing > 0:
        sizes[0] += missing
    return source, sizes, dim


def install(model: nn.Module, classes: Collection[type]) -> list[Region]:
    """Route every module of ``classes`` through ``autoplan::opaque_region``; undo with ``uninstall``."""
    installed = []
    for fqn, module in model.named_modules():
        if type(module) not in classes:
            continue
        names = tuple(name for name, _ in module.named_parameters()) + tuple(name for name, _ in module.named_buffers())
        found = Region(module, fqn, names)
        found.original_forward = module.forward
        key = fqn  # deterministic: it is part of the traced graph (and its fingerprint)
        _REGIONS[key] = found
        module.forward = _traced_forward(key, found)
        installed.append(found)
    return installed


def uninstall(regions: list[Region]) -> None:
    for found in regions:
        found.module.__dict__.pop("forward", None)


def _traced_forward(key: str, found: Region):
    def forward(*args, **kwargs):
        leaves, found.in_spec = tree_flatten((args, kwargs))
        found.in_constants = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        state = dict(found.module.named_parameters())
        state.update(dict(found.module.named_buffers()))
        outputs = OPAQUE_OP(key, tensors + [state[name] for name in found.state_names])
        out_iter = iter(outputs)
        out_leaves = [next(out_iter) if leaf is _TENSOR else leaf for leaf in found.out_constants]
        return tree_unflatten(out_leaves, found.out_spec)

    return forward


def is_data_dependent(error: BaseException) -> bool:
    """Whether a tracing error comes from shapes that depend on tensor values."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ in DATA_DEPENDENT_ERRORS or "data-dependent" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failing_module(error: BaseException, model: nn.Module) -> nn.Module | None:
    """The innermost module of ``model`` whose ``forward`` was running when ``error`` was raised."""
    modules = {id(m) for m in model.modules()}
    found = None
    tb = error.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, nn.Module) and id(candidate) in modules and tb.tb_frame.f_code.co_name == "forward":
            found = candidate
        tb = tb.tb_next
    return found
