"""The strategy DTensor runs for an op of a plan, given the layouts its inputs arrive in.

The plan picks one strategy per op; at run time DTensor picks its own, op by op, from the
layouts the inputs arrive in: the cheapest moves, the first of equals. Mostly the two
agree. Where they do not, the collectives that run are DTensor's, and so is the layout
the op's output leaves in: an add of a value split on dim 2 and one split on dim 0 moves
either one, at the same cost, and where the plan moved the second DTensor moves the
first; a view runs on its input as it arrives; a rule that follows one input offers
only what that input's layout allows. ``runtime_strategy`` asks DTensor's own propagation
(autoplan's rules installed, as while a planned model runs, and outside every cache: the
question is asked on a planning mesh) which strategy it will run.

The backward's ops that read gradients only are asked so too: the ``cat`` that joins a
split's output gradients (``joined_gradient``), the add of two gradients of one value
(``added_gradients``), a kernel DTensor runs on whole tensors only
(``replicated_gradient``) and a backward that reads nothing but its output's gradient
(``gradient_only_backward``). Those that read a value the forward saved as well are
``runtime_backward.py``'s, which asks through ``dtensor_runs`` and ``dtensor_spec``.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from autoplan.choices.decision import Decision
from autoplan.choices.graph import OP, is_tensor_input
from autoplan.dtensor import loss_parallel, overrides
from autoplan.dtensor.strategies import Strategy, runtime_schema_info, tensor_meta
from autoplan.placements import (
    REPLICATE,
    Spec,
    runtime_placements,
    runtime_spec,
    spec_from_placements,
)
from autoplan.trace.backward_run import gradient_makers, input_gradients, signature


def runtime_strategy(decision: Decision, arrived: list[Spec], mesh: DeviceMesh) -> Strategy | None:
    """DTensor's strategy for ``decision``'s op with its tensor inputs arriving in
    ``arrived`` (in the choice graph's input order); None where DTensor cannot say (no
    rule, a layout outside the planner's vocabulary): the plan's strategy stands."""
    node = decision.fx_node
    op = node.target
    if decision.kind != OP or not isinstance(op, torch._ops.OpOverload):
        return None
    split = loss_parallel.runtime_layout(node, arrived, lambda whole: _propagated(node, op, whole, mesh))
    if split is not None:  # cross-entropy on logits split by class: autoplan's handlers run it
        return Strategy(*split)
    found = _propagated(node, op, arrived, mesh)
    return Strategy(*found) if found is not None else None


def _propagated(node: fx.Node, op, arrived: list[Spec], mesh: DeviceMesh) -> tuple[tuple, tuple] | None:
    """DTensor's (outputs, inputs) for ``node`` with its inputs arriving in ``arrived``."""
    layouts = iter(arrived)

    def spec_of(arg):
        if is_tensor_input(arg):
            return dtensor_spec(mesh, next(layouts), arg.meta["val"])
        return arg.meta.get("val") if isinstance(arg, fx.Node) else arg

    try:
        args, kwargs = tree_map(spec_of, (node.args, node.kwargs), is_leaf=lambda a: isinstance(a, fx.Node))
        schema = OpSchema(op, args, kwargs, schema_info=runtime_schema_info(op))
        sharding = overrides.propagate_uncached(schema)
        out = sharding.output_spec
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outputs = tuple(None if s is None else runtime_spec(s.placements) for s in outs)
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else ()
        inputs = tuple(runtime_spec(s.placements) for s in wanted) + tuple(arrived[len(wanted):])
    except Exception:  # DTensor cannot run it as given: the plan's own strategy (a fallback) runs
        return None
    if len(inputs) != len(arrived) or not outputs:
        return None
    return outputs, inputs


JOINS = (torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default)
"""Splits whose backward is a ``cat`` of their outputs' gradients."""


def joined_gradient(decision: Decision, parts: list[Spec | None], mesh: DeviceMesh) -> tuple[Spec, list[Spec]] | None:
    """DTensor's ``cat`` of the split ``decision``'s output gradients, laid out as they come
    (``parts``, one per output): (the joined gradient's layout, the layout it reads each part
    in). The backward joins the parts as they arrive, moving each only as far as the cat's
    rule asks: MPT's fused q/k/v projection, chunked in three, gets its query's gradient
    split by rows on dp, its key's partial there and its value's whole, and the cat keeps the
    split, reduce-scattering the key's. None where DTensor cannot say, or a part has no
    gradient (autograd joins zeros for it)."""
    node = decision.fx_node
    given = [p for p in parts if p is not None]
    if decision.kind != OP or node.target not in JOINS or len(given) != len(parts):
        return None
    values = node.meta.get("val")
    if not isinstance(values, (tuple, list)) or len(values) != len(parts):
        return None
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    specs = [dtensor_spec(mesh, p, v) for p, v in zip(given, values)]
    op = torch.ops.aten.cat.default
    try:
        joined, reads = dtensor_runs(op, specs, (specs, dim))
    except Exception:  # DTensor cannot join them as given: the planner's own rule stands
        return None
    return (joined, reads) if len(reads) == len(parts) else None


def added_gradients(a: Spec, b: Spec, value: torch.Tensor, mesh: DeviceMesh) -> tuple[Spec, list[Spec]] | None:
    """DTensor's add of two gradients of ``value`` laid out ``a`` and ``b``, as autograd sums
    them: (the layout of the sum, the layouts it reads them in); None where DTensor cannot say."""
    specs = [dtensor_spec(mesh, layout, value) for layout in (a, b)]
    try:
        return dtensor_runs(torch.ops.aten.add.Tensor, specs)
    except Exception:  # no answer: the planner's own rule stands
        return None


def replicated_gradient(decision: Decision, k: int, grad: Spec, mesh: DeviceMesh) -> tuple[Spec, Spec] | None:
    """(the layout DTensor reads it in, the layout it hands it on in) for the gradient of
    input ``k`` of ``decision``'s op, laid out ``grad`` by the planner's rules, where the
    op's backward makes it last with a kernel DTensor runs on whole tensors only: the
    backward of ``linalg_solve_triangular`` masks the matrix's gradient with ``tril``, whose
    rule replicates every input (DTensor's ``linalg_replicate_strategy``), so the gradient
    is gathered and reduced there on every axis (Qwen3-Next's gated delta rule). None
    elsewhere, or where DTensor cannot say."""
    maker = gradient_makers(decision.fx_node).get(k)
    if maker is None or not isinstance(maker.op, torch._ops.OpOverload) or all(p == REPLICATE for p in grad):
        return None
    tensors = [a for a in tree_flatten((maker.args, maker.kwargs))[0] if isinstance(a, torch.Tensor)]
    value = _input_value(decision, k)
    if len(tensors) != 1 or value is None or tensors[0].shape != value.shape:
        return None  # the gradient the rules lay out is not what the kernel reads
    gradient = dtensor_spec(mesh, grad, tensors[0])
    args, kwargs = tree_map(lambda a: gradient if a is tensors[0] else a, (maker.args, maker.kwargs))
    try:
        sharding = overrides.propagate_uncached(OpSchema(maker.op, args, kwargs, schema_info=runtime_schema_info(maker.op)))
        out = sharding.output_spec
        made = spec_from_placements(out.placements)
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else (gradient,)
        read = spec_from_placements(wanted[0].placements)
    except Exception:  # DTensor cannot run it as given: the planner's own rules stand
        return None
    if any(p != REPLICATE for p in made):
        return None
    return read, made


def dtensor_runs(op, specs: list, args: tuple | None = None) -> tuple[Spec, list[Spec]]:
    """(the layout DTensor makes ``op``'s output in, the layouts it reads the tensors
    ``specs`` in) where ``op`` is called on ``args`` (default: ``specs``), as its sharding
    rule says; raises where DTensor cannot run it as given."""
    schema = OpSchema(op, tuple(specs) if args is None else args, {}, schema_info=runtime_schema_info(op))
    sharding = overrides.propagate_uncached(schema)
    wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else specs
    return spec_from_placements(sharding.output_spec.placements), [spec_from_placements(s.placements) for s in wanted]


def dtensor_spec(mesh: DeviceMesh, layout: Spec, value: torch.Tensor) -> DTensorSpec:
    """DTensor's spec of a tensor shaped like ``value`` laid out ``layout`` on ``mesh``."""
    return DTensorSpec(mesh, runtime_placements(layout), tensor_meta=tensor_meta(value))


def _input_value(decision: Decision, k: int) -> torch.Tensor | None:
    """The traced value of ``decision``'s tensor input ``k``."""
    node = decision.fx_node
    inputs = [a for a in tree_flatten((node.args, node.kwargs))[0] if is_tensor_input(a)]
    value = inputs[k].meta.get("val") if k < len(inputs) else None
    return value if isinstance(value, torch.Tensor) else None


_followed: dict[tuple, Spec | None] = {}


def gradient_only_backward(node: fx.Node, grad: Spec, mesh: DeviceMesh) -> Spec | None:
    """The layout of the gradient the backward of ``node`` (an op of one tensor) hands its
    input, where that backward reads nothing but its output's gradient, laid out ``grad``,
    and DTensor runs each of its ops on the gradient as it comes: a pad's backward pads the
    gradient back (``constant_pad_nd`` with the pads negated), a cumulative sum's sums it
    reversed (``flip``, ``cumsum``, ``flip``), each keeping a split on a dim it does not
    work along (a Mamba-2 scan's chunk padding and decay sums, their gradients split by
    heads). None where one of those ops moves the gradient, reads anything else (a value
    saved by the forward), or DTensor cannot say."""
    key = (signature(node), grad, tuple(mesh.shape))
    if key not in _followed:
        follow = _FollowLayouts(grad, mesh)
        with overrides.installed():
            gradients = input_gradients(node, follow)
        tensors = [g for g in gradients or () if g is not None]
        layout = follow.layouts.get(id(tensors[0])) if len(tensors) == 1 and not follow.moved else None
        _followed[key] = layout
    return _followed[key]


class _FollowLayouts(TorchDispatchMode):
    """Follows the output gradient's layout through the ops a backward runs, by DTensor's
    propagation; ``moved`` once an op asks for another layout of what it reads, or reads
    a tensor not made from the gradient."""

    def __init__(self, grad: Spec, mesh: DeviceMesh):
        super().__init__()
        self.grad, self.mesh = grad, mesh
        self.layouts: dict[int, Spec] = {}
        self.made: list[torch.Tensor] = []  # held, so that no id is reused while following
        self.moved = False

    def __call__(self, gradients):
        self.made += gradients
        self.layouts.update((id(g), self.grad) for g in gradients)
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.moved:
            self._follow(func, args, kwargs or {}, out)
        return out

    def _follow(self, func, args, kwargs, out) -> None:
        read = []

        def spec_of(arg):
            if not isinstance(arg, torch.Tensor):
                return arg
            layout = self.layouts.get(id(arg))
            if layout is None:
                raise LookupError("a tensor not made from the gradient")
            read.append(layout)
            return dtensor_spec(self.mesh, layout, arg)

        try:
            schema_args, schema_kwargs = tree_map(spec_of, (args, kwargs))
            schema = OpSchema(func, schema_args, schema_kwargs, schema_info=runtime_schema_info(func))
            sharding = overrides.propagate_uncached(schema)
        except Exception:  # a saved value read, or no rule: DTensor's answer is not this one
            self.moved = True
            return
        wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else ()
        if any(spec_from_placements(s.placements) != layout for s, layout in zip(wanted, read)):
            self.moved = True
            return
        specs = sharding.output_spec if isinstance(sharding.output_spec, (tuple, list)) else (sharding.output_spec,)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for tensor, spec in zip(outs, specs):
            if isinstance(tensor, torch.Tensor) and isinstance(spec, DTensorSpec):
                self.layouts[id(tensor)] = spec_from_placements(spec.placements)
                self.made.append(tensor)
