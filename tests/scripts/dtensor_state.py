"""What autoplan leaves changed in DTensor, seen from a fresh interpreter (``tests/integration/apply/test_dtensor_untouched.py``).

    python tests/scripts/dtensor_state.py import|install|mlp|plan-then-mlp|failed-backward|moved WHAT

Prints one JSON line. ``changed`` lists the DTensor internals that differ from a snapshot
taken before autoplan was imported (functions compared by identity, registries entry by entry).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.tensor._dispatch as dispatch
import torch.distributed.tensor._sharding_prop as sharding_prop
from torch._subclasses.fake_impls import op_implementations_dict
from torch.distributed.tensor import DTensor

ROOT = Path(__file__).resolve().parents[2]
PROPAGATOR = DTensor._op_dispatcher.sharding_propagator


def snapshot() -> dict:
    return {
        "select": getattr(sharding_prop, "_select_min_cost_strategy", None),
        "move": getattr(dispatch, "redistribute_local_tensor", None),
        "strategy_funcs": dict(PROPAGATOR.op_strategy_funcs),
        "single_dim": dict(PROPAGATOR.op_single_dim_strategy_funcs),
        "schema_info": dict(PROPAGATOR.op_to_schema_info),
        "cache": PROPAGATOR.propagate_op_sharding,
        "uncached": vars(PROPAGATOR).get("propagate_op_sharding_non_cached"),
        "dispatcher": dict(vars(DTensor._op_dispatcher)),
        "handlers": dict(DTensor._op_dispatcher._custom_op_handlers),
        "fake_kernels": dict(op_implementations_dict),
    }


def changed(before: dict) -> list[str]:
    now = snapshot()
    return sorted(k for k in before if (now[k] != before[k] if isinstance(before[k], dict) else now[k] is not before[k]))



def import_everything() -> int:
    import importlib
    import pkgutil

    import autoplan

    names = [m.name for m in pkgutil.walk_packages(autoplan.__path__, "autoplan.")]
    for name in names:
        importlib.import_module(name)
    return len(names)


def mlp_program() -> dict:
    """torch's own tensor parallelism on an MLP, forward and backward, counted by CommDebugMode."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (8,))
    model = parallelize_module(MLP(), mesh,
        {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel(use_local_output=False)})
    with CommDebugMode() as comm:
        out = model(torch.randn(4, 8, 16))
        # Flattening (batch, seq) with seq split: DTensor makes a strided shard here, without a collective.
        flat = distribute_tensor(torch.randn(4, 8, 16), mesh, [Shard(1)]).reshape(32, 16)
        (out.sum() + flat.sum()).backward()
    return {
        "collectives": {str(op): n for op, n in sorted(comm.get_comm_counts().items(), key=str)},
        "placements": [str(out.placements), str(flat.placements), str(model.up.weight.grad.placements)],
    }


def plan_and_step() -> bool:
    """Plan the tiny Llama example under a budget that shards its weights, apply it, run a step."""
    sys.path[:0] = [str(ROOT / "tests")]
    from torch.distributed.device_mesh import init_device_mesh
    from zoo import example_path, forced_plan

    import autoplan
    from autoplan.model_file import import_model_file

    plan = forced_plan(example_path("llama"), (2, 4), ("dp", "tp"))
    example = import_model_file(Path(example_path("llama")))
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    model = autoplan.apply_plan(example.build_model(), plan, mesh)
    output = model(**autoplan.shard_batch(example.example_inputs(), plan, mesh))
    autoplan.training_loss(output).backward()
    torch.optim.AdamW(model.parameters()).step()
    return any("S(" in str(spec) for spec in plan.parameters.values())


def failed_backward() -> str:
    """A step of the tiny Llama under a plan whose backward raises part-way (a gradient hook
    on the token embedding, the last parameter the backward reaches, fails as a device out
    of memory would): the error the training loop sees."""
    sys.path[:0] = [str(ROOT / "tests")]
    from torch.distributed.device_mesh import init_device_mesh
    from zoo import example_path, forced_plan

    import autoplan
    from autoplan.model_file import import_model_file

    plan = forced_plan(example_path("llama"), (2, 4), ("dp", "tp"))
    example = import_model_file(Path(example_path("llama")))
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    model = autoplan.apply_plan(example.build_model(), plan, mesh)

    def out_of_memory(grad):
        raise torch.OutOfMemoryError("out of memory while reducing a gradient")

    model.get_parameter("model.embed_tokens.weight").register_hook(out_of_memory)
    output = model(**autoplan.shard_batch(example.example_inputs(), plan, mesh))
    try:
        autoplan.training_loss(output).backward()
    except torch.OutOfMemoryError as err:
        return str(err)
    return "the backward did not raise"


def main(mode: str, *rest: str) -> dict:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    if mode == "moved":  # an internal autoplan changes is gone from this torch
        delattr(sharding_prop if rest[0] == "select" else dispatch,
            {"select": "_select_min_cost_strategy", "move": "redistribute_local_tensor"}[rest[0]])
    before = snapshot()
    found: dict = {}
    if mode == "import":
        found["modules"] = import_everything()
    elif mode == "install":
        from autoplan.dtensor import overrides

        overrides.install()
        overrides.install()
        found["changed_while_installed"] = changed(before)
        overrides.uninstall()
        found["changed_after_nested_uninstall"] = changed(before)
        overrides.uninstall()
    elif mode == "mlp":
        found["mlp"] = mlp_program()
    elif mode == "plan-then-mlp":
        found["weights_split"] = plan_and_step()
        found["planned_and_stepped"] = True
        found["mlp"] = mlp_program()
    elif mode == "failed-backward":
        from autoplan.dtensor import overrides

        found["error"] = failed_backward()
        found["installs_left"] = overrides._depth
        found["mlp"] = mlp_program()
    elif mode == "moved":
        from autoplan.dtensor import overrides

        try:
            overrides.install()
        except Exception as err:  # noqa: BLE001 - the test reads the message
            found["error"] = f"{type(err).__name__}: {err}"
    found["changed"] = changed(before)
    return found


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
