"""Activation checkpointing of the modules a plan names (``Plan.recompute``), with torch's
own non-reentrant ``torch.utils.checkpoint``.

- "full": nothing the module's call makes is kept for the backward; the call runs again
  when the backward first needs one of its tensors.
- "selective": matmul and attention outputs are kept (``SAVED_OPS``), everything else
  (norms, activations, elementwise ops, the collectives around them) runs again; the
  op-level policy torchtitan calls selective AC ("op" mode), without its every-second-mm rule.

Where the boundary sits: around the module's whole call, its forward pre-hooks and forward
hooks included, as ``checkpoint_wrapper`` encloses a module whose ParallelStyle hooks sit on
the module itself (torchtitan: tensor parallelism first, then activation checkpointing).
So ``apply_plan``'s input moves and parameter gathers run inside the checkpoint, and again
in the rerun. That is the one place that works and the one that saves memory:

- a parameter the plan gathers for use (``Plan.parameter_uses``) is back in its stored
  (sharded) layout once the module returned; a rerun that started after the gather would
  compute with the shard, other ops than the forward ran. Inside, the rerun gathers again,
  and the gathered weight is not kept (FSDP's reshard-after-forward);
- the checkpoint keeps the module's inputs as they arrive, not their moved (often
  gathered, larger) copies;
- observers that hook the module (``verify.observe.CollectiveCounter``) see the rerun as
  a call of the module, and charge its collectives to it.

No wrapper module: the instance's ``_call_impl`` (what ``nn.Module.__call__`` runs) becomes
the class's, run under the checkpoint. FQNs and state_dict keys stay as they are, and
``torch.compile`` of the module (per block) traces through it into a checkpointed region.
Nothing global changes: only the named modules' own attribute.

The rerun happens inside the backward, where the root's ``plan_execution`` has ended: it
runs again under what the forward ran under (``recompute_context``).
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from autoplan.errors import PlanError
from autoplan.recompute_policy import selective_keeps

SAVED_OPS = selective_keeps()
"""What "selective" keeps: the outputs of matmuls and attention (the expensive ops to rerun)."""


def _keep_matmuls_and_attention(ctx, func, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def check_recompute(recompute: dict[str, str], module_names) -> None:
    """A PlanError for a module ``recompute`` names that the model lacks, or the root."""
    stray = sorted(set(recompute) - set(module_names))
    if stray:
        raise PlanError(f"plan recompute names modules not in the model: {stray[:3]}",
                        hint="name modules by their FQN in model.named_modules(), or re-plan this model")
    if "" in recompute:
        raise PlanError("plan recompute names the root module (\"\"), whose call starts and ends the plan's execution",
                        hint="name the blocks to recompute (e.g. layers.0), not the model itself")
    for fqn in sorted(recompute):
        outer = next((other for other in sorted(recompute) if fqn.startswith(other + ".")), None)
        if outer is not None:
            # nested checkpoints rerun the inner call within the outer rerun: not what the prediction counts
            raise PlanError(f"plan recompute names {fqn} inside {outer}, which it also names",
                            hint="name the outer module or the inner one, not both")


def checkpoint_modules(modules: dict[str, nn.Module], recompute: dict[str, str], recompute_context) -> None:
    """Run each module ``recompute`` names under the checkpoint its mode says.

    ``recompute_context()``: a context manager the rerun (in the backward) runs under."""
    for fqn, mode in sorted(recompute.items()):
        _checkpoint_calls(modules[fqn], mode, recompute_context)


def _checkpoint_calls(module: nn.Module, mode: str, recompute_context) -> None:
    call = type(module)._call_impl.__get__(module)  # hooks and forward, as nn.Module runs them
    selective = mode == "selective"

    def contexts():
        if not selective:
            return nullcontext(), _fresh(recompute_context)
        forward, rerun = create_selective_checkpoint_contexts(_keep_matmuls_and_attention)
        return forward, _entered(_fresh(recompute_context), rerun)

    # Under torch.compile (per block), dynamo traces a "selective" call into one checkpointed
    # region of the compiled graph, its rerun part of the compiled backward (DTensor already
    # lowered: nothing to run under the plan's execution again; dynamo takes only the two
    # selective-checkpoint modes as context). Where the call swaps a gathered parameter into
    # ``module._parameters`` (a side effect dynamo refuses inside a checkpoint), dynamo breaks
    # the graph there and the checkpoint runs as it does eagerly. A "full" call runs its
    # checkpoint eagerly, outside the compiled graphs (torch's checkpoint does not compile
    # what it calls): traced, such a region with DTensor ops fails in AOTAutograd (torch
    # 2.13: "expected all tensors_saved_with_vc_check to be Tensors", a DeviceMesh among them).
    def compiled_contexts():
        if not torch.compiler.is_compiling():
            return contexts()  # dynamo broke the graph at the checkpoint: it runs eagerly after all
        return create_selective_checkpoint_contexts(_keep_matmuls_and_attention)

    @torch.compiler.disable
    def eager_checkpoint(*args, **kwargs):
        return checkpoint(call, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    def checkpointed_call(*args, **kwargs):
        if not torch.is_grad_enabled():
            return call(*args, **kwargs)  # nothing is kept for a backward: nothing to recompute
        if torch.compiler.is_compiling() and selective:
            return checkpoint(call, *args, use_reentrant=False, context_fn=compiled_contexts, **kwargs)
        return eager_checkpoint(*args, **kwargs)

    setattr(module, "_call_impl", checkpointed_call)  # noqa: B010 - this instance's call, over the class's method


class _entered:
    """Several context managers as one, entered in order (outermost first)."""

    def __init__(self, *managers):
        self.managers = managers
        self.stack = None

    def __enter__(self):
        self.stack = ExitStack()
        for manager in self.managers:
            self.stack.enter_context(manager)
        return self

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


class _fresh:
    """``factory()``'s context manager, a new one each time it is entered: torch's checkpoint
    enters its rerun context once per rerun, and a backward split in two (the zero-bubble
    pipeline schedules: the input's gradient first, the weights' later) reruns a block
    twice, while a ``contextlib.contextmanager`` object can be entered once only."""

    def __init__(self, factory):
        self.factory = factory
        self.entered: list = []

    def __enter__(self):
        manager = self.factory()
        self.entered.append(manager)
        return manager.__enter__()

    def __exit__(self, *exc):
        return self.entered.pop().__exit__(*exc)
