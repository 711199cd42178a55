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

from autoplan.apply import apply_plan, shard_batch
from autoplan.checkpoint import load_checkpoint, save_checkpoint
from autoplan.errors import AutoplanError
from autoplan.loss import training_loss
from autoplan.materialize import load_full_state_dict
from autoplan.plan import Plan
from autoplan.profile import load_profile
from autoplan.score import Score, score
from autoplan.suggest import suggest

__all__ = [
    "AutoplanError", "Plan", "Score", "apply_plan", "load_checkpoint", "load_full_state_dict", "load_profile",
    "save_checkpoint", "score", "shard_batch", "suggest", "training_loss",
]
