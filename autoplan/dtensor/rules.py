"""Sharding rules autoplan adds to DTensor's registry, for the planner and the apply engine alike.

- CPU fused attention. On a CPU mesh (gloo) PyTorch runs ``scaled_dot_product_attention``
  as ``_scaled_dot_product_flash_attention_for_cpu``, for which DTensor has no rule; on
  meta tensors autoplan traces the call as that op too (``dtensor/fused_attention.py``). The rule
  below allows what attention allows on each mesh axis: replicate everything, shard the
  batch dim, or shard the heads dim (of q, k, v, the output and the log-sum-exp alike; an
  ``attn_mask`` follows where it has the dim whole), as DTensor's GPU attention rules do.
- ``fill_`` with a tensor value. ``x[..., 0] = 0`` (T5 shifting its labels) fills a view
  with a 0-dim tensor; DTensor has a rule for ``fill_.Scalar`` only. The tensor keeps its
  layout (a partial one is gathered first: filling a share would not fill the sum) and the
  value is read replicated.
- Replicate fallback. An op DTensor has no rule for is planned replicated (the plan lists
  it in ``fallback_ops`` and in its warnings); ``register_replicate_fallback`` lets DTensor
  run it that way: every input is gathered to Replicate and the op runs on whole tensors,
  so results are exact, only slower. Its backward op (``<name>_backward``), when it has
  no rule either, gets the same fallback.
- Reshapes without strided shards (``dtensor/view_rules.py``): DTensor's rules for the reshaping
  views are wrapped so that no view makes a ``_StridedShard``, a placement the planner
  cannot plan; the input is replicated on that axis first, as the plan priced it.
- Strategy choice (``dtensor/strategy_choice.py``): where DTensor must move an input anyway, it no
  longer splits a value on an axis where it arrives replicated just to shrink that move.

Registration is process-wide and idempotent; rules DTensor already has are never replaced,
only the reshaping views' are wrapped.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo

from autoplan.errors import PlanError
from autoplan.dtensor.strategy_choice import keep_replicated_axes_whole
from autoplan.dtensor.view_rules import keep_views_unstrided

aten = torch.ops.aten
_PROPAGATOR = DTensor._op_dispatcher.sharding_propagator
_registered: set = set()

_BATCH_DIM, _HEADS_DIM = 0, 1


def _has_rule(op) -> bool:
    return op in _PROPAGATOR.op_strategy_funcs or op in _PROPAGATOR.op_single_dim_strategy_funcs


def _register(op, strategy_func, schema_info: RuntimeSchemaInfo) -> None:
    if op in _registered or _has_rule(op):
        return
    _PROPAGATOR.register_op_strategy(op, strategy_func, schema_info=schema_info)
    _registered.add(op)


def _tensor_args(op_schema: OpSchema) -> list[OpStrategy]:
    return [arg for arg in op_schema.args_schema if isinstance(arg, OpStrategy)]


def _attention_rows(num_outputs: int, num_inputs: int, mask_shape: tuple | None) -> list[list]:
    """Per-axis placements (outputs, inputs, then the mask): all replicated, batch-sharded,
    head-sharded. The mask (``attn_mask``, broadcast against the scores) follows a sharded
    dim where it has that dim whole, and is read replicated where it broadcasts over it."""
    extra = [] if mask_shape is None else [Replicate()]
    rows = [[Replicate()] * (num_outputs + num_inputs) + extra]
    for dim in (_BATCH_DIM, _HEADS_DIM):
        if mask_shape is not None:
            extra = [attention_mask_placement(Shard(dim), mask_shape)]
        rows.append([Shard(dim)] * (num_outputs + num_inputs) + extra)
    return rows


def attention_mask_placement(scores: Shard | Replicate, mask_shape: tuple):
    """Where an attention mask goes when the scores (batch, heads, q, k) are placed
    ``scores`` on an axis: split on the same dim where the mask has it whole, replicated
    where it broadcasts over it (fewer dims, or size 1)."""
    if not isinstance(scores, Shard):
        return Replicate()
    mask_dim = scores.dim - (4 - len(mask_shape))
    return Shard(mask_dim) if mask_dim >= 0 and mask_shape[mask_dim] > 1 else Replicate()


def _mask_shape(op_schema: OpSchema) -> tuple | None:
    mask = op_schema.kwargs_schema.get("attn_mask")
    return tuple(mask.strategies[0].output_spec.tensor_meta.shape) if isinstance(mask, OpStrategy) else None


def _cpu_attention(op_schema: OpSchema, num_outputs: int, input_index: int) -> OpStrategy:
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    mesh = op_schema.get_mesh_from_args()
    inputs = _tensor_args(op_schema)
    rows = _attention_rows(num_outputs, len(inputs), _mask_shape(op_schema))
    return expand_to_full_mesh_op_strategy(mesh, op_schema, rows, input_index=input_index)


def _cpu_attention_forward(op_schema: OpSchema) -> OpStrategy:
    return _cpu_attention(op_schema, 2, 2)  # outputs: attention output, log-sum-exp


def _cpu_attention_backward(op_schema: OpSchema) -> OpStrategy:
    return _cpu_attention(op_schema, 3, 3)  # inputs: grad_out, q, k, v, out, logsumexp; outputs: grad q, k, v


def _fill_with_tensor(op_schema: OpSchema) -> OpStrategy:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    target, value = op_schema.args_schema[:2]
    mesh = op_schema.get_mesh_from_args()
    strategies = []
    for option in target.strategies:
        spec = option.output_spec
        placements = tuple(Replicate() if p.is_partial() else p for p in spec.placements)
        kept = DTensorSpec(mesh, placements, spec.tensor_meta)
        value_spec = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, value.strategies[0].output_spec.tensor_meta)
        strategies.append(OpSpec(output_specs=kept, input_specs=[kept, value_spec]))
    return OpStrategy(strategies)


def register_builtin_rules() -> None:
    """Rules autoplan always adds (see the module docstring)."""
    _register(
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        _cpu_attention_forward,
        RuntimeSchemaInfo(3, static_kwargkey=["scale"]),
    )
    _register(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        _cpu_attention_backward,
        RuntimeSchemaInfo(6, static_kwargkey=["scale"]),
    )
    _register(aten.fill_.Tensor, _fill_with_tensor, RuntimeSchemaInfo())
    keep_views_unstrided()
    keep_replicated_axes_whole()


def _replicate_everything(op_schema: OpSchema) -> OpStrategy:
    mesh = op_schema.get_mesh_from_args()
    replicate = (Replicate(),) * mesh.ndim
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    inputs = [DTensorSpec(mesh, replicate, arg.strategies[0].output_spec.tensor_meta) for arg in _tensor_args(op_schema)]
    out = op_schema.op._schema.returns
    outputs = tuple(DTensorSpec(mesh, replicate) for _ in out) if len(out) > 1 else DTensorSpec(mesh, replicate)
    return OpStrategy([OpSpec(output_specs=outputs, input_specs=inputs)])


def op_by_name(name: str):
    """``aten.renorm.default`` (as ``str(op)`` prints it) -> the OpOverload."""
    try:
        namespace, packet, overload = name.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (ValueError, AttributeError) as err:
        raise PlanError(f"the plan names an unknown op {name!r} in fallback_ops", hint="re-plan with this torch version") from err


def register_replicate_fallback(op) -> None:
    """Let DTensor run ``op`` (and its backward op, if it lacks a rule) fully replicated."""
    static = RuntimeSchemaInfo(needs_pytree=True)
    _register(op, _replicate_everything, static)
    backward = getattr(aten, f"{op._schema.name.split('::')[1]}_backward", None)
    if backward is not None:
        for overload in backward.overloads():
            _register(getattr(backward, overload), _replicate_everything, static)
