"""Vocabulary-parallel cross-entropy: the loss computed on logits split by class.

A language model's logits are its largest activation (tokens x vocabulary, float32 for the
loss). A column-parallel output layer makes them split by vocabulary on the
tensor-parallel axis, but DTensor's rules for ``log_softmax`` and ``nll_loss`` want the
class dim whole, so every rank gathers the full logits, several times their share, and
keeps them for the backward. Megatron and torchtitan ("loss parallel") compute the loss
on the split logits instead: a softmax over a split dim needs only each row's maximum and
sum of exponentials from the other ranks, and picking each target's log-probability only
its owner's share of the sum.

autoplan offers that layout to the planner and runs it, for the four ops cross-entropy
becomes (``F.cross_entropy`` = ``_log_softmax`` + ``nll_loss_forward``, and their backward ops):

- planning (``strategies.py``): each strategy of DTensor's that holds the class dim whole
  on a mesh axis gets a twin that splits it there, its outputs as before (the loss and the
  target count come out whole on that axis after the sum below);
- running (``overrides.py`` installs ``HANDLERS`` as DTensor custom op handlers while a
  plan runs): an op whose class dim arrives split on one axis runs as below, anything
  else as DTensor runs it. Per row (a token), on the axis ``t`` that splits the classes:

      _log_softmax:               max over the share, all_reduce(max) on t; sum of exp over
                                  the share, all_reduce(sum) on t; x - max - log(sum)
      _log_softmax_backward_data: g - exp(out) * sum(g), the sum all_reduced on t
      nll_loss_forward:           each rank picks the targets in its share of the classes;
                                  the (reduced) loss all_reduced on t
      nll_loss_backward:          -grad at the targets in the share; nothing moves

  The other axes keep DTensor's own layouts for the op (batch split, partial loss),
  read from DTensor's rule with the class dim whole.
- costing and prediction (``own_collectives``): the all_reduces above, with their bytes.

Only a class-index target without class weights is handled (what language models train
with); anything else runs as DTensor runs it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor, Replicate, Shard, _dispatch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OutputSharding

from autoplan.dtensor.strategy import Strategy
from autoplan.placements import REPLICATE, Spec, is_partial, local_shape, shard, shard_dim

aten = torch.ops.aten

LOG_SOFTMAX = aten._log_softmax.default
LOG_SOFTMAX_BACKWARD = aten._log_softmax_backward_data.default
NLL_LOSS = aten.nll_loss_forward.default
NLL_LOSS_BACKWARD = aten.nll_loss_backward.default
_REDUCTION_NONE, _REDUCTION_MEAN = 0, 1
_LEAST_PRECISION = torch.float32
"""Half-precision logits are worked on, and their row maxima and sums sent, in float32."""


# ---- planning ---------------------------------------------------------------------------

def class_dim(op, args) -> int | None:
    """The dim ``op`` reduces over classes, where the split layout applies to it, else None."""
    if op is LOG_SOFTMAX:
        x = args[0]
        return args[1] % x.dim() if x.dim() else None
    if op is NLL_LOSS:
        x, weight = args[0], args[2] if len(args) > 2 else None
        return 1 if x.dim() == 2 and weight is None else None
    return None


def split_strategies(op, args, strategies: list) -> list:
    """For each strategy of DTensor's with the class dim whole on an axis, its twin with the
    class dim split there: the input split, the outputs (a log-softmax's: split alike) as they were."""
    dim = class_dim(op, args)
    if dim is None:
        return []
    found = []
    for strategy in strategies:
        x_spec = strategy.inputs[0]
        if any(is_partial(p) or shard_dim(p) == dim for p in x_spec):
            continue
        for axis, placement in enumerate(x_spec):
            if placement != REPLICATE:
                continue
            if op is NLL_LOSS and (
                strategy.inputs[1][axis] != REPLICATE or any(s is not None and s[axis] != REPLICATE for s in strategy.outputs)
            ):
                continue  # the handler reads the targets whole on that axis and makes the loss whole there
            split_x = _with(x_spec, axis, shard(dim))
            outputs = strategy.outputs
            if op is LOG_SOFTMAX:
                outputs = (_with(outputs[0], axis, shard(dim)),) + tuple(outputs[1:])
            found.append(Strategy(outputs, (split_x,) + tuple(strategy.inputs[1:])))
    return found


def split_axis(op, args, x_spec: Spec) -> int | None:
    """The mesh axis on which ``op`` (a loss op) reads its class dim split, else None."""
    dim = class_dim(op, args)
    if dim is None or any(is_partial(p) for p in x_spec):
        return None
    axes = [axis for axis, p in enumerate(x_spec) if shard_dim(p) == dim]
    return axes[0] if len(axes) == 1 else None


def own_collectives(node, outputs, strategy, mesh_shape, requires_grad: bool) -> list[tuple[str, int, float, bool]]:
    """``(kind, axis, bytes, in the backward)`` of each collective the fx ``node``'s op runs
    itself under ``strategy`` (the split layout's all_reduces); [] for every other op and
    layout. ``outputs`` are the op's output values (fake tensors)."""
    op = node.target
    if op not in (LOG_SOFTMAX, NLL_LOSS) or not strategy.inputs:
        return []
    args = _arg_values(node)
    axis = split_axis(op, args, strategy.inputs[0])
    if axis is None:
        return []
    out = outputs[0]
    local = local_shape(tuple(out.shape), strategy.outputs[0], mesh_shape)
    if op is LOG_SOFTMAX:
        dim = class_dim(op, args)
        assert dim is not None  # split_axis found the classes split
        rows = math.prod(local) // local[dim]  # one max and one sum per row
        nbytes = float(rows * max(_LEAST_PRECISION.itemsize, out.element_size()))
        found = [("all_reduce", axis, nbytes, False), ("all_reduce", axis, nbytes, False)]
        return found + ([("all_reduce", axis, nbytes, True)] if requires_grad else [])
    return [("all_reduce", axis, float(math.prod(local) * out.element_size()), False)]


def _arg_values(node) -> list:
    """The fx node's positional arguments, its input nodes as their traced values."""
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]


def _with(spec: Spec, axis: int, placement: str) -> Spec:
    return tuple(placement if i == axis else p for i, p in enumerate(spec))


def runtime_layout(node, arrived: list[Spec], propagate) -> tuple[tuple, tuple] | None:
    """(outputs, inputs) of what ``HANDLERS`` run for the fx ``node``'s op with its inputs
    arriving in ``arrived``, else None (DTensor runs it). ``propagate(arrived)`` is
    DTensor's answer for other arrivals, as (outputs, inputs)."""
    op = node.target
    if op not in (LOG_SOFTMAX, NLL_LOSS) or not arrived:
        return None
    args = _arg_values(node)
    axis = split_axis(op, args, arrived[0])
    if axis is None:
        return None
    dim = class_dim(op, args)
    if op is LOG_SOFTMAX:
        return (arrived[0],), (arrived[0],)
    assert dim is not None  # split_axis found the classes split
    whole = propagate([_with(arrived[0], axis, REPLICATE)] + list(arrived[1:]))
    if whole is None:
        return None
    outputs, inputs = whole
    return outputs, (_with(inputs[0], axis, shard(dim)),) + tuple(inputs[1:])


# ---- running ----------------------------------------------------------------------------

def _split_on(x, dim: int) -> int | None:
    """The one mesh axis on which DTensor ``x`` holds ``dim`` split (nothing partial), else None."""
    if not isinstance(x, DTensor) or any(p.is_partial() for p in x.placements):
        return None
    axes = [axis for axis, p in enumerate(x.placements) if isinstance(p, Shard) and type(p) is Shard and p.dim == dim]
    return axes[0] if len(axes) == 1 else None


def _working(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(_LEAST_PRECISION) if tensor.dtype.itemsize < _LEAST_PRECISION.itemsize else tensor


def _all_reduce(tensor: torch.Tensor, op: str, mesh, axis: int) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(tensor, op, (mesh, axis)))


def _log_softmax_handler(op_call, args, kwargs):
    x, dim, half_to_float = args[0], args[1] % args[0].dim(), args[2]
    axis = _split_on(x, dim)
    if axis is None or kwargs:
        return _as_dtensor_runs(op_call, args, kwargs)
    local = x._local_tensor
    result_dtype = torch.float32 if half_to_float else local.dtype
    work = _working(local)
    row_max = _all_reduce(work.amax(dim, keepdim=True), "max", x.device_mesh, axis)
    result = work - row_max
    total = _all_reduce(_sum_of_exp(result, dim), "sum", x.device_mesh, axis)
    result.sub_(total.log_())  # in place: the kernel it stands for makes its output alone
    return _wrap(result.to(result_dtype), x, x.placements)


_EXP_PIECES = 8
"""The sum of exponentials is taken over this many slices of rows, one at a time."""


def _sum_of_exp(shifted: torch.Tensor, dim: int) -> torch.Tensor:
    """``exp(shifted).sum(dim, keepdim=True)`` without a whole logits-sized temporary: the
    fused kernel this stands for holds its input and output only, and a third such
    tensor beside them would be the step's peak (the float32 logits of a language model)."""
    rows = next((d for d in range(shifted.dim()) if d != dim), None)
    if rows is None:
        return torch.exp(shifted).sum(dim, keepdim=True)
    return torch.cat([torch.exp(piece).sum(dim, keepdim=True) for piece in shifted.chunk(_EXP_PIECES, rows)], rows)


def _log_softmax_backward_handler(op_call, args, kwargs):
    grad, output, dim, input_dtype = args[0], args[1], args[2] % args[1].dim(), args[3]
    axis = _split_on(output, dim)
    if axis is None or kwargs or not isinstance(grad, DTensor) or grad.placements != output.placements:
        return _as_dtensor_runs(op_call, args, kwargs)
    g, out = grad._local_tensor, output._local_tensor
    g = _working(g)
    total = _all_reduce(g.sum(dim, keepdim=True), "sum", output.device_mesh, axis)
    # g - exp(out) * total, in one new tensor: this backward runs at the step's memory peak
    result = torch.exp(out.to(g.dtype)).mul_(total).neg_().add_(g)
    return _wrap(result.to(input_dtype), output, output.placements)


def _nll_loss_handler(op_call, args, kwargs):
    x = args[0]
    axis = _class_axis(x, args[2] if len(args) > 2 else None, kwargs)
    if axis is None:
        return _as_dtensor_runs(op_call, args, kwargs)
    whole, specs = _whole_on(op_call, args, axis)
    x, target = _to_spec(x, specs[0], axis, 1), _to_spec(args[1], specs[1])
    reduction, ignore_index = args[3], args[4]
    inside, index = _in_share(target._local_tensor, x, axis, ignore_index)
    picked = x._local_tensor.gather(1, index.unsqueeze(1)).squeeze(1)
    loss = torch.where(inside, -picked, torch.zeros_like(picked))
    total_weight = (target._local_tensor != ignore_index).sum().to(loss.dtype)
    if reduction != _REDUCTION_NONE:
        loss = loss.sum()
        if reduction == _REDUCTION_MEAN:
            loss = loss / total_weight
    loss = _all_reduce(loss, "sum", x.device_mesh, axis)
    out_specs = whole.output_spec
    return (DTensor._op_dispatcher.wrap(loss, out_specs[0]), DTensor._op_dispatcher.wrap(total_weight, out_specs[1]))


def _nll_loss_backward_handler(op_call, args, kwargs):
    x = args[1]
    axis = _class_axis(x, args[3] if len(args) > 3 else None, kwargs)
    if axis is None:
        return _as_dtensor_runs(op_call, args, kwargs)
    _whole, specs = _whole_on(op_call, args, axis, position=1)
    grad, x = _to_spec(args[0], specs[0]), _to_spec(x, specs[1], axis, 1)
    target, total_weight = _to_spec(args[2], specs[2]), _to_spec(args[6], specs[-1])
    reduction, ignore_index = args[4], args[5]
    inside, index = _in_share(target._local_tensor, x, axis, ignore_index)
    scale = -grad._local_tensor
    if reduction == _REDUCTION_MEAN:
        scale = scale / total_weight._local_tensor
    scale = torch.where(inside, scale.expand(inside.shape), torch.zeros((), dtype=scale.dtype, device=scale.device))
    result = torch.zeros_like(x._local_tensor)
    result.scatter_(1, index.unsqueeze(1), scale.unsqueeze(1).to(result.dtype))
    return _wrap(result, x, x.placements)


def _class_axis(x, weight, kwargs) -> int | None:
    """The axis splitting an nll_loss input's classes where the handlers run it (a 2-D
    input, no class weights), else None."""
    return _split_on(x, 1) if x.dim() == 2 and weight is None and not kwargs else None


def _in_share(target: torch.Tensor, x: DTensor, axis: int, ignore_index: int):
    """Which targets fall in this rank's share of the classes, and their index in it."""
    share = x._local_tensor.shape[1]
    start = x.device_mesh.get_local_rank(axis) * share
    inside = (target != ignore_index) & (target >= start) & (target < start + share)
    return inside, torch.where(inside, target - start, torch.zeros_like(target))


def _whole_on(op_call, args, axis: int, position: int = 0):
    """DTensor's decision for ``op_call`` had the classes arrived whole on ``axis``: its
    output sharding and the input specs it wants (the class input's: split again)."""
    x = args[position]
    placements = list(x.placements)
    placements[axis] = Replicate()
    spec = DTensorSpec(x.device_mesh, tuple(placements), tensor_meta=x._spec.tensor_meta)
    dispatcher = DTensor._op_dispatcher
    whole_args = list(args)
    whole_args[position] = DTensor.from_local(x._local_tensor, x.device_mesh, spec.placements, run_check=False,
                                              shape=x.shape, stride=x.stride())
    info = dispatcher.unwrap_to_op_info(op_call, tuple(whole_args), {})
    assert info.schema is not None, op_call  # DTensor arguments: DTensor's op has a schema
    # the propagator's LRU cache is typed as returning object; it returns an OutputSharding
    sharding: OutputSharding = dispatcher.sharding_propagator.propagate_op_sharding(info.schema)  # type: ignore[assignment]
    wanted = sharding.redistribute_schema.args_spec if sharding.redistribute_schema is not None else info.schema.args_spec
    return sharding, list(wanted)


def _to_spec(value, spec: DTensorSpec, axis: int | None = None, dim: int = 0):
    """``value`` (a DTensor) moved to ``spec``, except that ``axis`` keeps ``dim`` split."""
    placements = list(spec.placements)
    if axis is not None:
        placements[axis] = Shard(dim)
    if tuple(placements) == value.placements:
        return value
    if not value.requires_grad:
        # The targets: moved as DTensor's dispatcher moves an op's input, so that the
        # backward gets what the forward moved (``saved_inputs``), not a second gather.
        wanted = DTensorSpec(value.device_mesh, tuple(placements), tensor_meta=value._spec.tensor_meta)
        local = _dispatch.redistribute_local_tensor(value._local_tensor, value._spec, wanted)
        return DTensor.from_local(local, value.device_mesh, wanted.placements, run_check=False, shape=value.shape,
                                  stride=value.stride())
    return value.redistribute(value.device_mesh, tuple(placements))


def _wrap(local: torch.Tensor, like: DTensor, placements) -> DTensor:
    return DTensor.from_local(local, like.device_mesh, placements, run_check=False, shape=like.shape, stride=like.stride())


def _as_dtensor_runs(op_call, args, kwargs):
    """The op as DTensor runs it without these handlers: its rule's decision, inputs moved, local op."""
    dispatcher = DTensor._op_dispatcher
    info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    info.output_sharding = dispatcher.sharding_propagator.propagate_op_sharding(info.schema)
    local = dispatcher._dispatch_get_local_results_slow_path(op_call, args, info)
    return dispatcher.wrap(local, info.output_sharding.output_spec)


HANDLERS = {
    LOG_SOFTMAX: _log_softmax_handler,
    LOG_SOFTMAX_BACKWARD: _log_softmax_backward_handler,
    NLL_LOSS: _nll_loss_handler,
    NLL_LOSS_BACKWARD: _nll_loss_backward_handler,
}
"""DTensor custom op handlers (``overrides.py`` installs them while a plan runs)."""
