"""Parameters as a plan places them: stored, gathered for use, and their gradients reduced.

``apply_plan`` (``engine.py``) makes every parameter a DTensor in its stored layout, and
has each module gather the ones it computes with to the layout the plan computes in
(``Plan.parameter_uses``), just around its forward. Autograd carries each gradient back
through that gather to the stored layout; what is still partial after accumulation
(data parallelism's reduction) is reduced by a hook on the parameter.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, distribute_tensor

from autoplan.apply.materialize import empty_shard
from autoplan.errors import PlanError
from autoplan.placements import format_spec, to_placements
from autoplan.plan.module_plan import Plan


def distribute_parameters(model: nn.Module, plan: Plan, mesh: DeviceMesh) -> set[str]:
    """Make every parameter a DTensor; returns the FQNs of modules whose parameters were on meta."""
    done: dict[int, nn.Parameter] = {}
    born_meta: set[str] = set()
    for module_fqn, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            fqn = f"{module_fqn}.{name}" if module_fqn else name
            if param.is_meta:
                born_meta.add(module_fqn)
            if id(param) not in done:
                placements = to_placements(plan.parameters[fqn])
                try:
                    data = empty_shard(param, mesh, placements) if param.is_meta else distribute_tensor(param.data, mesh, placements)
                except Exception as err:
                    raise PlanError(f"cannot place {fqn} (shape {list(param.shape)}) as "
                        f"{format_spec(plan.parameters[fqn])}: {err}", hint="re-plan this model") from err
                new = nn.Parameter(data, requires_grad=param.requires_grad)
                if new.requires_grad:
                    new.register_post_accumulate_grad_hook(_reduce_gradient)
                done[id(param)] = new
            module.register_parameter(name, done[id(param)])
    return born_meta


def gather_parameters_for_use(modules: dict[str, nn.Module], plan: Plan, mesh: DeviceMesh) -> None:
    """Around each module's forward, its parameters take the layout the plan computes with.

    The pre-hook swaps each such parameter for ``param.redistribute(use layout)`` (an
    all-gather, for a parameter stored sharded and used replicated); autograd carries the
    gradient back through the redistribute, reducing it to the stored layout (a
    reduce-scatter where it was partial). The post-hook puts the parameter back, so
    ``named_parameters()``, the optimizer and checkpoints only ever see the stored one.
    A module that reads another's parameter in its own code (``Plan.parameter_readers``)
    swaps that parameter in its owner the same way around its own forward. A tied
    parameter is swapped under each of its names: the plan does not know which one the
    code reads (MobileBERT's head gathers its ``bias`` and adds ``self.decoder.bias``).
    """
    holders: dict[int, list[tuple[nn.Module, str]]] = {}  # parameter -> where it is held, under every name
    for module in modules.values():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name))
    by_reader: dict[tuple[str, str], dict[str, tuple[Placement, ...]]] = {}
    for fqn, spec in plan.parameter_uses.items():
        owner, _, name = fqn.rpartition(".")
        if any(owner == region or owner.startswith(region + ".") for region in plan.opaque_modules):
            continue  # an opaque region gathers all its state itself (``engine._run_replicated``)
        placements = to_placements(spec)  # parsed here, not in traced hooks
        for reader in (owner, *plan.parameter_readers.get(fqn, ())):
            by_reader.setdefault((reader, owner), {})[name] = placements
    for (reader, owner), specs in by_reader.items():
        holder = modules[owner]
        names = {name: tuple(holders.get(id(holder._parameters[name]), [(holder, name)])) for name in specs}
        stored: dict[tuple[str, int], nn.Parameter] = {}

        # Plain item assignments on ``_parameters`` (as FSDP2 swaps its unsharded parameters):
        # dynamo replays them in order when it traces these hooks into a compiled graph.
        # Nested readers (an owner called inside its reader) swap in turn: the inner one
        # finds the parameter already in its use layout and uses it as it is, and each puts
        # back what it found. (Redistributing it again would move nothing forward, but its
        # backward would bring the inner use's gradient to that layout on its own: NeoMME's
        # head reads the embedding projection tied to one its embedding calls, and the
        # embedding's gradient, partial on tp, was all-reduced before the sum.)
        def swap_in(module, args, specs=specs, stored=stored, holder=holder, names=names):
            for name, spec in specs.items():
                current = holder._parameters[name]
                moved = current if tuple(current.placements) == tuple(spec) else current.redistribute(mesh, spec)
                for index, (alias, alias_name) in enumerate(names[name]):
                    stored[(name, index)] = alias._parameters[alias_name]
                    alias._parameters[alias_name] = moved

        def swap_out(module, args, output, specs=specs, stored=stored, names=names):
            for name in specs:
                for index, (alias, alias_name) in enumerate(names[name]):
                    if (name, index) in stored:
                        alias._parameters[alias_name] = stored.pop((name, index))

        modules[reader].register_forward_pre_hook(swap_in)
        modules[reader].register_forward_hook(swap_out, always_call=True)


def _reduce_gradient(param: torch.Tensor) -> None:
    """Bring the gradient to the parameter's placements (reduces Partial gradients)."""
    assert isinstance(param, DTensor), type(param)  # registered on distributed parameters only
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        param.grad = grad.redistribute(param.device_mesh, param.placements)
