"""A tied plan widened to the whole model: the last traced layer's entries copied to every later layer."""

from __future__ import annotations

from dataclasses import replace

from autoplan.plan.module_plan import Plan, total_table
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks, tied_fingerprint


def expand_plan(plan: Plan, blocks: RepeatedBlocks, checkpointed: int | None = None, unchecked: dict | None = None) -> Plan:
    """The plan of the cut model, with the last traced layer's entries copied to every later layer.

    The traced layers were tied to one set of decisions, so copying the last one gives
    every layer of the full model its parameters' placements and module layouts, keyed by
    that layer's own FQNs (what ``apply_plan`` checks against ``named_parameters()``).
    ``checkpointed``: how many of the first layers the plan checkpoints (its ``recompute``
    names the traced ones among them; None: as the last traced layer, every later one);
    the layers past them get their collectives from ``unchecked`` (the cut model's table
    without checkpointing) where it is given.
    """
    modules = blocks.widen(plan.predicted.module_collectives)
    if unchecked is not None:
        def past(fqn: str) -> bool:
            layer = blocks.layer_of(fqn)
            return layer is not None and layer >= max(checkpointed or 0, KEPT_LAYERS)

        modules = {fqn: table for fqn, table in modules.items() if not past(fqn)}
        modules.update({fqn: table for fqn, table in blocks.widen(unchecked).items() if past(fqn)})
    recompute = blocks.widen(plan.recompute)
    if checkpointed is not None:
        recompute = {fqn: mode for fqn, mode in recompute.items() if (blocks.layer_of(fqn) or 0) < checkpointed}
    predicted = replace(plan.predicted, module_collectives=modules, collectives=total_table(modules))
    return replace(
        plan,
        predicted=predicted,
        parameters=blocks.widen(plan.parameters),
        modules=blocks.widen(plan.modules),
        parameter_uses=blocks.widen(plan.parameter_uses),
        parameter_readers=blocks.widen(plan.parameter_readers, names_modules=True),
        parameter_shapes=blocks.widen(plan.parameter_shapes),
        parameter_dtypes=blocks.widen(plan.parameter_dtypes),
        module_types=blocks.widen(plan.module_types),
        recompute=recompute,
        expert_parallel=blocks.widen(plan.expert_parallel),
        fingerprint=tied_fingerprint(plan.fingerprint, blocks),
    )
