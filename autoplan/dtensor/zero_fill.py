"""A fill with zeros keeps a sum partial: ``masked_fill`` of a partial value, in place or not.

Autograd's backward of ``std`` (and of ``norm``) divides the output's gradient and zeroes
it in place where the result is zero: ``(grad / (2 * result)).masked_fill_(result == 0, 0)``.
That gradient arrives partial on a mesh axis where the forward's input was split along the
reduced dim (Gemma3n's MLP cuts its gate at ``mean + std * k`` over the intermediate dim,
which the forcing budget splits on dp: the cut's gradient, summed over that dim, is
partial there). DTensor rules ``masked_fill`` as pointwise, with no partial rows, and an
in-place op cannot move its self, so the backward failed ("aten.masked_fill_.Scalar:
in-place operations that require placement changes are not supported. The input has
placement (Partial(sum), Shard(dim=0))").

Zeroing the same positions of every rank's share zeroes them in the sum (and the mean):
``masked_fill(sum_r s_r, m, 0) == sum_r masked_fill(s_r, m, 0)`` with the mask whole on
that axis. ``with_zero_fill_partials`` wraps DTensor's single-axis rule for these ops
(``overrides.py`` installs it) to add that row where the fill value is zero.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.tensor import Partial, Replicate

aten = torch.ops.aten

MASKED_FILLS = (aten.masked_fill.Scalar, aten.masked_fill_.Scalar)
"""(self, mask, value): the ops whose rule gets the zero-fill rows."""

_KEPT_PARTIALS = (Partial("sum"), Partial("avg"))


def with_zero_fill_partials(info, diverged=lambda: None):
    """DTensor's single-axis rule ``info`` (a ``_SingleDimStrategyInfo``) for a masked fill,
    also offering, where the fill value is zero, self and output partial alike (sum or
    mean) with the mask replicated; ``diverged()`` is called whenever that adds rows."""
    rule = info.func

    def strategy(op, args_schema, kwargs_schema):
        rows = rule(op, args_schema, kwargs_schema)
        if not _fills_zeros(args_schema):
            return rows
        diverged()
        return [*rows, *([partial, partial, Replicate()] for partial in _KEPT_PARTIALS)]

    return dataclasses.replace(info, func=strategy)


def _fills_zeros(args_schema) -> bool:
    value = args_schema[2] if len(args_schema) > 2 else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
