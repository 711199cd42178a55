"""A tied plan widened to the whole model: the last traced layer's entries copied to every later layer."""

from __future__ import annotations

from dataclasses import replace

from autoplan.plan.module_plan import Plan, total_table
from autoplan.trace.repeats import RepeatedBlocks, tied_fingerprint


def expand_plan(plan: Plan, blocks: RepeatedBlocks) -> Plan:
    """The plan of the cut model, with the last traced layer's entries copied to every later layer.

    The traced layers were tied to one set of decisions, so copying the last one gives
    every layer of the full model its parameters' placements and module layouts, keyed by
    that layer's own FQNs (what ``apply_plan`` checks against ``named_parameters()``).
    """
    modules = blocks.widen(plan.predicted.module_collectives)
    predicted = replace(plan.predicted, module_collectives=modules, collectives=total_table(modules))
    return replace(
        plan,
        predicted=predicted,
        parameters=blocks.widen(plan.parameters),
        modules=blocks.widen(plan.modules),
        parameter_uses=blocks.widen(plan.parameter_uses),
        parameter_shapes=blocks.widen(plan.parameter_shapes),
        parameter_dtypes=blocks.widen(plan.parameter_dtypes),
        module_types=blocks.widen(plan.module_types),
        recompute=blocks.widen(plan.recompute),
        fingerprint=tied_fingerprint(plan.fingerprint, blocks),
    )
