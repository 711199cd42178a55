"""An empty tensor made like a partial one is not partial: ``empty_like`` makes it replicated.

On the CPU, a training-mode dropout runs as ``x * empty_like(x).bernoulli_(1 - p).div_(1 - p)``.
DTensor's rule for ``empty_like`` lays its output out as its input, ``Partial`` included
(torch 2.13's strategy function and 2.14's single-axis rule alike), and the in-place random
fill then refuses a partial self, which it cannot move: a dropout whose input arrives
partial failed ("aten.bernoulli_.float: in-place operations that require placement changes
are not supported. The input has placement (Replicate(), Partial(sum))", XLNet's attention
output on tp under the forcing budget).

An empty tensor holds nothing that awaits a reduction: like ``zeros_like`` and the other
fills (whose rule DTensor already writes so), it is ``Replicate`` where its input is
partial, and the mask filled into it multiplies the partial input term by term, which
keeps the sum (each rank's share scaled by the same mask). ``not_partial`` wraps DTensor's
rule for these ops, whichever registry holds it (``overrides.py`` installs it).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

aten = torch.ops.aten

EMPTY_LIKES = (aten.empty_like.default,)
"""Ops whose output holds nothing of their input but its shape, and whose rule carries a
partial input on to the output."""


def not_partial_rows(info, diverged=lambda: None):
    """DTensor's single-axis rule ``info`` (a ``_SingleDimStrategyInfo``; rows are
    ``[output, input, ...]``) with each partial output made ``Replicate``."""
    rule = info.func

    def strategy(op, args_schema, kwargs_schema):
        rows = []
        for row in rule(op, args_schema, kwargs_schema):
            if _is_partial(row[0]):
                diverged()
                row = [Replicate(), *row[1:]]
            rows.append(row)
        return rows

    return dataclasses.replace(info, func=strategy)


def not_partial_specs(rule, diverged=lambda: None):
    """DTensor's strategy function ``rule`` (``op_schema -> OpStrategy``) with each partial
    output placement made ``Replicate``."""

    def strategy(op_schema):
        found = rule(op_schema)
        if not isinstance(found, OpStrategy):
            return found
        specs = []
        for spec in found.strategies:
            out = spec.output_specs
            if isinstance(out, DTensorSpec) and any(p.is_partial() for p in out.placements):
                diverged()
                placements = tuple(Replicate() if p.is_partial() else p for p in out.placements)
                spec = OpSpec(
                    output_specs=DTensorSpec(out.mesh, placements, tensor_meta=out.tensor_meta),
                    input_specs=spec.input_specs,
                    redistribute_cost=spec.redistribute_cost,
                )
            specs.append(spec)
        return OpStrategy(specs)

    return strategy


def _is_partial(placement) -> bool:
    return getattr(placement, "is_partial", lambda: False)()
