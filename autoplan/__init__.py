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

# Each public name is imported from its module on first use: `import autoplan` (and so
# `python -m autoplan`, whose Ctrl-C handling starts in __main__) does not wait for torch.
_HOMES = {
    "apply_plan": "autoplan.apply.engine", "shard_batch": "autoplan.apply.engine",
    "load_checkpoint": "autoplan.interop.checkpoint", "save_checkpoint": "autoplan.interop.checkpoint",
    "AutoplanError": "autoplan.errors", "training_loss": "autoplan.trace.loss",
    "load_full_state_dict": "autoplan.apply.materialize", "Plan": "autoplan.plan.module_plan",
    "load_profile": "autoplan.cost.profile", "Score": "autoplan.evaluate.score", "score": "autoplan.evaluate.score",
    "suggest": "autoplan.pipeline.cached", "LossWithInputs": "autoplan.model_file",
}

__all__ = sorted(_HOMES)  # noqa: PLE0605 - the lazy exports are the keys of _HOMES


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'autoplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_HOMES])

