"""A tied plan widened to the whole model: the last traced layer's entries copied to every later layer."""

from __future__ import annotations

from dataclasses import replace

from autoplan.plan.module_plan import Plan, total_table
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks, tied_fingerprint


def expand_plan(plan: Plan, blocks: RepeatedBlocks, keep: int = KEPT_LAYERS) -> Plan:
    """The plan of the cut model, with the last traced layer's entries copied to every later layer.

    The traced layers were tied to one set of decisions, so copying the last one gives
    every layer of the full model its parameters' placements and module layouts, keyed by
    that layer's own FQNs (what ``apply_plan`` checks against ``named_parameters()``).
    """
    last = keep - 1

    def widen(table: dict) -> dict:
        out = dict(table)
        for fqn, value in table.items():
            if blocks.layer_of(fqn) == last:
                for index in range(keep, blocks.count):
                    out[blocks.rename(fqn, index)] = value
        return out

    modules = widen(plan.predicted.module_collectives)
    predicted = replace(plan.predicted, module_collectives=modules, collectives=total_table(modules))
    return replace(
        plan,
        predicted=predicted,
        parameters=widen(plan.parameters),
        modules=widen(plan.modules),
        parameter_uses=widen(plan.parameter_uses),
        parameter_shapes=widen(plan.parameter_shapes),
        module_types=widen(plan.module_types),
        fingerprint=tied_fingerprint(plan.fingerprint, blocks),
    )
