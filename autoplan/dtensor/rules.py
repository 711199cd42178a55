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
- Backward ops of pointwise ops. DTensor rules every op tagged pointwise, but not the
  backward ops of some (``hardtanh_backward`` of ReLU6, ``hardswish_backward``,
  ``softplus_backward``): they read the output's gradient and the forward's input, of one
  shape, element by element, and get the same rule: every tensor replicated or split
  alike on each mesh axis (``_elementwise``).
- The unchecked twins of indexing ops. ``aten._unsafe_index`` and ``aten._unsafe_index_put``
  are ``index`` and ``index_put`` without bounds checks, which torch's own decompositions
  call (bilinear ``interpolate`` under ``torch.compile``: CoaT's and other timm models'
  upsampling); DTensor rules the checked ops only, so the unchecked ones get the checked
  ones' rules (``SAME_RULE_AS``, read from DTensor's registry while installing).
- Replicate fallback. An op DTensor has no rule for is planned replicated (the plan lists
  it in ``fallback_ops`` and in its warnings); ``fallback_rules`` let DTensor
  run it that way: every input is gathered to Replicate and the op runs on whole tensors,
  so results are exact, only slower. Its backward op (``<name>_backward``), when it has
  no rule either, gets the same fallback.

``overrides.py`` adds these to DTensor's registry while autoplan plans or runs a plan, and
deletes them again; a rule DTensor already has is never replaced.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo

from autoplan.dtensor import context_axis
from autoplan.errors import PlanError

aten = torch.ops.aten

_BATCH_DIM, _HEADS_DIM = 0, 1


def _tensor_args(op_schema: OpSchema) -> list[OpStrategy]:
    return [arg for arg in op_schema.args_schema if isinstance(arg, OpStrategy)]


def _attention_rows(num_outputs: int, num_inputs: int, mask_shape: tuple | None) -> list[list]:
    """Per-axis placements (outputs, inputs, then the mask): all replicated, batch-sharded,
    head-sharded. The mask (``attn_mask``, broadcast against the scores) follows a sharded
    dim where it has that dim whole, and is read replicated where it broadcasts over it."""
    extra: list[Placement] = [] if mask_shape is None else [Replicate()]
    rows: list[list[Placement]] = [[Replicate()] * (num_outputs + num_inputs) + extra]
    for dim in (_BATCH_DIM, _HEADS_DIM):
        if mask_shape is not None:
            extra = [attention_mask_placement(Shard(dim), mask_shape)]
        rows.append([Shard(dim)] * (num_outputs + num_inputs) + extra)
    return rows


def attention_mask_placement(scores: Placement, mask_shape: tuple):
    """Where an attention mask goes when the scores (batch, heads, q, k) are placed
    ``scores`` on an axis: split on the same dim where the mask has it whole, replicated
    where it broadcasts over it (fewer dims, or size 1)."""
    if not isinstance(scores, Shard):
        return Replicate()
    mask_dim = scores.dim - (4 - len(mask_shape))
    return Shard(mask_dim) if mask_dim >= 0 and mask_shape[mask_dim] > 1 else Replicate()


def _mask_shape(op_schema: OpSchema) -> tuple | None:
    mask = op_schema.kwargs_schema.get("attn_mask")
    return _shape(mask) if isinstance(mask, OpStrategy) else None


def _shape(strategy: OpStrategy) -> tuple:
    """The shape of the value ``strategy`` places (planning runs on traced values: it is known)."""
    meta = strategy.strategies[0].output_spec.tensor_meta
    assert meta is not None, strategy
    return tuple(meta.shape)


def _cpu_attention(op_schema: OpSchema, num_outputs: int, input_index: int) -> OpStrategy:
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    mesh = op_schema.get_mesh_from_args()
    inputs = _tensor_args(op_schema)
    mask_shape = _mask_shape(op_schema)
    rows = _attention_rows(num_outputs, len(inputs), mask_shape)
    axis = context_axis.current_axis()
    if axis is None:
        return expand_to_full_mesh_op_strategy(mesh, op_schema, rows, input_index=input_index)
    # A context axis (context_attention.py): the sequence split there and nowhere else.
    rows += context_axis.attention_rows_on_axis(num_outputs + len(inputs), mask_shape)
    expanded = expand_to_full_mesh_op_strategy(mesh, op_schema, rows, input_index=input_index)
    seq = Shard(context_axis.SEQ_DIM)
    return OpStrategy([
        option for option in expanded.strategies
        if all((p == seq) == (a == axis) for a, p in enumerate(_first_output(option).placements))
    ])


def _first_output(option: OpSpec):
    specs = option.output_specs
    first = specs[0] if isinstance(specs, tuple) else specs
    assert first is not None, option
    return first


def _cpu_attention_forward(op_schema: OpSchema) -> OpStrategy:
    return _cpu_attention(op_schema, 2, 2)  # outputs: attention output, log-sum-exp


def _cpu_attention_backward(op_schema: OpSchema) -> OpStrategy:
    return _cpu_attention(op_schema, 3, 3)  # inputs: grad_out, q, k, v, out, logsumexp; outputs: grad q, k, v


def _fill_with_tensor(op_schema: OpSchema) -> OpStrategy:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    target, value = op_schema.args_schema[:2]
    assert isinstance(target, OpStrategy) and isinstance(value, OpStrategy), op_schema  # fill_(Tensor, Tensor)
    mesh = op_schema.get_mesh_from_args()
    strategies = []
    for option in target.strategies:
        spec = option.output_spec
        placements = tuple(Replicate() if p.is_partial() else p for p in spec.placements)
        kept = DTensorSpec(mesh, placements, spec.tensor_meta)
        value_spec = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, value.strategies[0].output_spec.tensor_meta)
        strategies.append(OpSpec(output_specs=kept, input_specs=[kept, value_spec]))
    return OpStrategy(strategies)


def backward_op(op):
    """The packet of ``op``'s backward op (``aten.<name>_backward``), or None."""
    return getattr(aten, f"{op._schema.name.split('::')[1]}_backward", None)


def _elementwise(op_schema: OpSchema) -> OpStrategy:
    """Every tensor argument and the output replicated or split on one dim alike, per mesh
    axis; replicated only where the arguments' shapes differ (a broadcast)."""
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    mesh = op_schema.get_mesh_from_args()
    tensors = _tensor_args(op_schema)
    shapes = {_shape(arg) for arg in tensors}
    width = 1 + len(tensors)
    rows: list[list[Placement | None]] = [[Replicate()] * width]
    if len(shapes) == 1:
        rows += [[Shard(dim)] * width for dim in range(len(next(iter(shapes))))]
    return expand_to_full_mesh_op_strategy(mesh, op_schema, rows, input_index=1)


@functools.cache
def _pointwise_backward_ops() -> tuple:
    """``<name>_backward.default`` of every op DTensor rules as pointwise."""
    from autoplan.dtensor.strategies import is_pointwise

    found = set()
    for name in dir(aten):
        packet = getattr(aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket) or "default" not in packet.overloads():
            continue
        if any(is_pointwise(getattr(packet, overload)) for overload in packet.overloads()):
            backward = backward_op(packet.default)
            if backward is not None and "default" in backward.overloads():
                found.add(backward.default)
    return tuple(sorted(found, key=str))


def builtin_rules() -> list[tuple]:
    """(op, strategy function, schema info) of the rules autoplan always adds (where DTensor
    has none: ``overrides.py`` never replaces one)."""
    return [
        *((op, _elementwise, RuntimeSchemaInfo(1)) for op in _pointwise_backward_ops()),
        (
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            _cpu_attention_forward,
            RuntimeSchemaInfo(3, static_kwargkey=["scale"]),
        ),
        (
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            _cpu_attention_backward,
            RuntimeSchemaInfo(6, static_kwargkey=["scale"]),
        ),
        (aten.fill_.Tensor, _fill_with_tensor, RuntimeSchemaInfo()),
    ]


SAME_RULE_AS = {
    aten._unsafe_index.Tensor: aten.index.Tensor,
    aten._unsafe_index_put.default: aten.index_put.default,
}
"""op -> the op whose DTensor rule it takes (same schema and semantics, where it has none)."""


def replicate_everything(op_schema: OpSchema) -> OpStrategy:
    """Every tensor input and output of the op replicated."""
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


def fallback_rules(ops, has_rule) -> list[tuple]:
    """Rules that run each of ``ops``, and its backward op where ``has_rule`` says it has
    none, fully replicated: (op, strategy function, schema info)."""
    static = RuntimeSchemaInfo(needs_pytree=True)
    found = []
    for op in sorted(ops, key=str):
        found.append((op, replicate_everything, static))
        backward = backward_op(op)
        if backward is not None:
            for overload in backward.overloads():
                if not has_rule(getattr(backward, overload)):
                    found.append((getattr(backward, overload), replicate_everything, static))
    return found
