"""autoplan: an automatic parallelization planner for PyTorch.

    plan = autoplan.suggest(model, example_inputs, mesh=(2, 4), axis_names=("dp", "tp"))
    plan.save("plans_out/model-2x4.json")
    autoplan.score(model, example_inputs, plan, profile="cpu-gloo").step_time_s  # any plan
    model = autoplan.apply_plan(model, plan, device_mesh)
    local_batch = autoplan.shard_batch(global_batch, plan, device_mesh)
    loss = autoplan.training_loss(model(**local_batch))
    autoplan.save_checkpoint(model, optimizer, "ckpt/step-100")   # load under any plan or mesh:
    autoplan.load_checkpoint(model, optimizer, "ckpt/step-100")
"""

import importlib
import sys
import types

# Each public name is imported from its module on first use: `import autoplan` (and so
# `python -m autoplan`, whose Ctrl-C handling starts in __main__) does not wait for torch.
_HOMES = {
    "apply_plan": "autoplan.apply", "shard_batch": "autoplan.apply",
    "load_checkpoint": "autoplan.checkpoint", "save_checkpoint": "autoplan.checkpoint",
    "AutoplanError": "autoplan.errors", "training_loss": "autoplan.loss",
    "load_full_state_dict": "autoplan.materialize", "Plan": "autoplan.plan",
    "load_profile": "autoplan.profile", "Score": "autoplan.score", "score": "autoplan.score",
    "suggest": "autoplan.suggest",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'autoplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_HOMES])


class _Package(types.ModuleType):
    """Keeps ``autoplan.suggest`` and ``autoplan.score`` the functions: importing a submodule
    sets the package attribute of its name, and two submodules share their function's name."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and name in _HOMES and _HOMES[name] == value.__name__:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
