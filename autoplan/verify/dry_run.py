"""A plan's step as it runs, on fake tensors: its collectives counted and priced.

``dry_run_collectives`` applies a plan to a fake twin of the model (``fake_model.py``) on a
fake process group of the plan's world size and runs one training step (forward, backward,
``AdamW.step()``), counting every collective with its module, mesh axis and bytes
(``observe.py``). No kernel runs and no weight is allocated. For a tied plan (a stack of
identical layers planned as one, ``trace/repeats.py``) the model is cut to its traced layers
and the count widened to every layer, as the plan itself is: the layers run alike.

``cost/comm.py``'s ``table_seconds`` prices such a table with the alpha-beta model the cost
stage prices every move with; the step's communication time is that sum.
This is the price ``suggest`` keeps for the plan it returns (``pipeline/problem.py``):
what the step runs, not a model of it.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from autoplan.apply.engine import apply_plan
from autoplan.plan.module_plan import Plan
from autoplan.trace.known_values import known_values
from autoplan.trace.repeats import KEPT_LAYERS, RepeatedBlocks, truncated
from autoplan.verify.fake_model import DATA_DEPENDENT, fake_twin
from autoplan.verify.fake_world import fake_world
from autoplan.verify.observe import CollectiveCounter
from autoplan.verify.step_check import _step


def dry_run_collectives(
    model: nn.Module, batch, plan: Plan, loss_fn=None, blocks: RepeatedBlocks | None = None, keep: int = KEPT_LAYERS,
) -> dict | None:
    """The collectives one training step of ``model`` under ``plan`` runs, as the plan's
    ``module_collectives`` table (module -> axis -> kind -> {"count", "bytes"}); None where
    the step cannot run on fake tensors (it reads tensor values, or fails there: ``verify``
    then says why on the step it runs) or no fake process group
    can be set up here (one is already running). With ``blocks``, ``plan`` is the cut
    model's (before ``expand_plan``) and the step runs on the model cut alike: the table is
    the cut model's, which ``expand_plan`` widens as it widens the plan. ``keep``: how many
    layers the cut keeps (``plan`` names as many)."""
    if dist.is_initialized():
        return None  # one process group per process: a job's own cannot host a fake world
    with (truncated(model, blocks, keep) if blocks is not None else nullcontext()):
        twin = fake_twin(model)
    fake_batch = _fake_batch(batch)
    try:
        with fake_world(plan.mesh_shape, plan.axis_names, as_on_devices=True) as device_mesh:
            apply_plan(twin, plan, device_mesh, loss_fn=loss_fn)
            optimizer = torch.optim.AdamW(twin.parameters())
            with CollectiveCounter(twin, device_mesh) as counter, known_values():
                _step(twin, fake_batch, plan, device_mesh)
                optimizer.step()
    except DATA_DEPENDENT:
        return None
    except Exception:  # noqa: BLE001  the step fails on fake tensors (a host read the model makes itself): the rules predict
        return None
    return counter.table()


def _fake_batch(batch):
    """The batch with each meta tensor (a model file's inputs are built on meta) made
    concrete: a floating one as a fake CPU tensor of its shape, an integer or boolean one
    (ids, labels, masks: small, and a mask's values choose the model's path) as a real
    tensor of ones: every token kept, as an attention mask of ones. Real tensors stay real,
    as in ``verify``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def swap(value):
        if isinstance(value, torch.Tensor) and value.is_meta:
            if not (value.is_floating_point() or value.is_complex()):
                return torch.ones(tuple(value.shape), dtype=value.dtype)
            with mode:
                return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="cpu")
        return value

    return tree_map(swap, batch)
