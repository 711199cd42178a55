"""One pipeline stage's share of a model: its modules kept, the others taken out.

A pipelined plan (``plan/pipeline_plan.py``) names, per stage, the module FQNs whose whole
subtrees it holds. A rank builds each of its stages from the model: the stage's modules
stay; a module that holds only other stages' modules is taken out, so that the model's own
forward runs through what is left (as torchtitan's pipeline split does). Going down from
the root, a module of another stage is taken out; a module above stage modules stays, its
own forward the glue between what is left of its children:

- a child of a ``ModuleList`` or ``ModuleDict`` (the repeated blocks) is deleted from it,
  the other children keeping their keys, so FQNs are unchanged and a loop over the
  container runs the stage's blocks alone;
- any other module (the embedding, the final norm, the head) is replaced by ``PassThrough``,
  which returns its first argument: the stage's input (the previous stage's activation,
  which arrives where the model's first input goes) passes through it unchanged.

Modules that hold no parameter of any stage (rotary tables, dropout) stay on every stage.
``stage_plan`` cuts the plan's layout down to what the stage keeps, for ``apply_plan``.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from autoplan.errors import PlanError
from autoplan.plan.module_plan import Plan
from autoplan.plan.pipeline_plan import PipelinePlan
from autoplan.tree_paths import fqn_within


class PassThrough(nn.Module):
    """A module taken out of this stage: returns its first argument unchanged."""

    def forward(self, *args, **kwargs):
        return args[0] if args else next(iter(kwargs.values()))


def _under(fqn: str, roots) -> bool:
    return any(fqn_within(fqn, root) for root in roots)


def _above(fqn: str, roots) -> bool:
    """Whether ``fqn`` is a strict ancestor of one of ``roots``."""
    return any(root.startswith(fqn + ".") for root in roots)


def keep_stage(model: nn.Module, pipeline: PipelinePlan, index: int) -> set[str]:
    """Take out of ``model``, in place, the modules of every other stage; returns the FQNs
    of the modules taken out or replaced (their subtrees are gone)."""
    own = pipeline.stages[index].modules
    others = [m for i, stage in enumerate(pipeline.stages) if i != index for m in stage.modules]
    removed: set[str] = set()

    def visit(module: nn.Module, prefix: str) -> None:
        container = isinstance(module, (nn.ModuleList, nn.ModuleDict))
        for name, child in list(module._modules.items()):
            if child is None:
                continue
            fqn = f"{prefix}.{name}" if prefix else name
            if _under(fqn, own):
                continue
            if _under(fqn, others):
                removed.add(fqn)
                if container:
                    # Straight from ``_modules``: ModuleList's ``del`` renumbers the rest.
                    del module._modules[name]
                else:
                    module._modules[name] = PassThrough()
            elif _above(fqn, own) or _above(fqn, others):
                visit(child, fqn)  # its own forward stays: the glue between its children

    visit(model, "")
    return removed


def stage_plan(plan: Plan, model: nn.Module, removed: set[str], first: bool = True, last: bool = True) -> Plan:
    """``plan``'s layout for what ``model`` (one stage, after ``keep_stage``) still holds:
    parameters, modules, recompute and the rest, without the modules taken out.

    A module kept as glue above the stage's modules (``model`` above the blocks) is cut:
    the layouts the plan gives its inputs and outputs are those of the whole model's input
    and output, which only the first stage takes in (``first``) and the last hands out
    (``last``). Elsewhere its input is the previous stage's activation, already in the
    placements its last block gave it, and its output the activation sent on; the plan's
    layouts there would move them (the final norm's sharding applied to every stage's
    output and undone on the next: an all-gather each way per microbatch that no step of
    the whole model runs), so they are left out."""
    params = {fqn for fqn, _ in model.named_parameters(remove_duplicate=False)}
    modules = {fqn for fqn, _ in model.named_modules() if not _under(fqn, removed)}
    tied_across = sorted(fqn for fqn, target in plan.tied_parameters.items() if (fqn in params) != (target in params))
    if tied_across:
        raise PlanError(
            f"pipeline stages split tied parameters: {tied_across[0]} is {plan.tied_parameters[tied_across[0]]}, "
                "held by another stage",
            hint="put the modules that share a parameter in one stage, or untie them (tie_word_embeddings=False)",
        )

    def kept(table: dict, names: set[str]) -> dict:
        return {key: value for key, value in table.items() if key in names}

    def ends(fqn: str, layout):
        if not _above(fqn, removed):
            return layout  # not cut: its inputs and outputs are the whole model's
        return dataclasses.replace(layout, inputs=layout.inputs if first else {}, outputs=layout.outputs if last else {})

    return dataclasses.replace(
        plan,
        parameters=kept(plan.parameters, params),
        modules={fqn: ends(fqn, layout) for fqn, layout in kept(plan.modules, modules).items()},
        opaque_modules=tuple(m for m in plan.opaque_modules if m in modules),
        parameter_uses=kept(plan.parameter_uses, params),
        parameter_readers={fqn: tuple(m for m in readers if m in modules)
                           for fqn, readers in plan.parameter_readers.items() if fqn in params},
        module_types=kept(plan.module_types, modules),
        parameter_shapes=kept(plan.parameter_shapes, params),
        parameter_dtypes=kept(plan.parameter_dtypes, params),
        tied_parameters={fqn: target for fqn, target in plan.tied_parameters.items() if fqn in params},
        recompute=kept(plan.recompute, modules),
        pipeline=None,
    )
