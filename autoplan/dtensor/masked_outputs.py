"""Outputs an op was asked not to make: no placement in any of its single-axis rows.

``convolution_backward`` takes an ``output_mask`` saying which of its three gradients
(input, weight, bias) to make; a convolution without a bias asks for no bias gradient.
DTensor's single-axis rule for it lays the bias gradient out ``Partial`` in every row
wherever ``bias_sizes`` is given (autograd passes ``[0]`` for a convolution without
bias), while the all-replicate row DTensor adds itself leaves a masked-off output
``None``. Torch 2.13 expands such rows over the mesh and drops the masked-off output's
placements. Torch 2.14 refuses any combination that mixes ``None`` with a placement at
one position across mesh axes ("strategy position 2 mixes None with placements across
mesh dims: (None, Partial(sum))"), so on a mesh of two or more axes every bias-free
convolution's backward failed (MobileNetV2, PoolFormer), on DTensor alone as well.

``without_masked_outputs`` wraps the rule (``overrides.py`` installs it) to leave each
masked-off output ``None`` in every row, where DTensor refuses the mix
(``refuses_mixed_outputs``, asked of DTensor on a two-axis planning mesh). Where it
does not (torch 2.13), nothing changes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

aten = torch.ops.aten

OUTPUT_MASKS = {aten.convolution_backward.default: (10, 3)}
"""op -> (the argument index of its output mask, how many outputs it has)."""


def without_masked_outputs(op, info, diverged=lambda: None):
    """DTensor's single-axis rule ``info`` (a ``_SingleDimStrategyInfo``) for ``op``, with
    every output its ``output_mask`` turns off laid out ``None`` in each row;
    ``diverged()`` is called whenever that changes a row."""
    rule = info.func
    mask_index, outputs = OUTPUT_MASKS[op]

    def strategy(op, args_schema, kwargs_schema):
        rows = rule(op, args_schema, kwargs_schema)
        mask = args_schema[mask_index] if len(args_schema) > mask_index else None
        if not isinstance(mask, (list, tuple)):
            return rows
        off = [i for i, wanted in enumerate(mask[:outputs]) if not wanted]
        changed = []
        for row in rows:
            row = list(row)
            if any(row[i] is not None for i in off):
                diverged()
                for i in off:
                    row[i] = None
            changed.append(row)
        return changed

    return dataclasses.replace(info, func=strategy)


@functools.cache
def refuses_mixed_outputs() -> bool:
    """Whether DTensor's own propagation refuses a bias-free ``convolution_backward`` of
    replicated operands on a two-axis mesh (torch 2.14: its rule's bias-gradient
    placement mixes with the all-replicate row's ``None``); False where it runs it
    (torch 2.13). Asked without autoplan's changes, of a planning mesh."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    from autoplan.dtensor.planning_mesh import planning_mesh

    mesh = planning_mesh((2, 2), ("probe_a", "probe_b"))

    def spec(shape):
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return DTensorSpec(mesh, (Replicate(), Replicate()), tensor_meta=TensorMeta(shape, strides, torch.float32))

    grad, image, weight = spec((2, 4, 1, 1)), spec((2, 4, 1, 1)), spec((4, 4, 1, 1))
    args = (grad, image, weight, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    propagator = DTensor._op_dispatcher.sharding_propagator
    try:
        propagator.propagate_op_sharding_non_cached(OpSchema(aten.convolution_backward.default, args, {}))
    except Exception as err:  # noqa: BLE001 - any refusal of this probe is the answer
        return "mixes None" in str(err)
    return False
