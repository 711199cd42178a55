"""Every public-zoo model plans on meshes (8), (2,4) and (2,2,2), and the
plan applies on a fake process group of 8 ranks: every parameter holds the plan's placements
and its local shard's shape, forward and backward run, and every parameter gets a gradient
of its shard's shape. (That a gradient ends in its parameter's placements is not asserted:
the apply engine's gradient hook makes it so; which collectives that takes is checked
against the prediction by ``tests/integration/zoo/test_verify_zoo.py``.) The hard cases (sizes that do not divide
the mesh, a data-dependent mixture-of-experts) run on 2x4.
"""

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES, ROOT
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore
from zoo import HARD_CASES, MESHES, PUBLIC_ZOO, example_path

import autoplan
from autoplan.model_file import import_model_file, load_model_file
from autoplan.placements import format_spec, spec_from_placements, to_placements

CASES = [
    pytest.param(
        name, mesh, id=f"{name}-{'x'.join(map(str, mesh))}",
        marks=[pytest.mark.slow] if len(mesh) == 3 else [],  # 3-D meshes take seconds each
    )
    for name, mesh in [*((n, m) for n in PUBLIC_ZOO for m in MESHES), *((n, (2, 4)) for n in HARD_CASES)]
]


@pytest.fixture(scope="module")
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


def _call(model, batch):
    return model(**batch) if isinstance(batch, dict) else model(*batch)


@pytest.mark.parametrize("name,mesh", CASES)
def test_plan_applies_and_trains_on_fake_process_group(fake_world, name, mesh):
    axis_names = MESHES[mesh]
    loaded = load_model_file(example_path(name))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=mesh, axis_names=axis_names)
    assert plan.solver.status == "optimal"
    assert plan.predicted.step_time_s > 0

    example = import_model_file(EXAMPLES / f"{name}.py")
    torch.manual_seed(0)
    model = example.build_model()
    batch = example.example_inputs()
    device_mesh = init_device_mesh("cpu", mesh, mesh_dim_names=axis_names)
    autoplan.apply_plan(model, plan, device_mesh)
    loss = autoplan.training_loss(_call(model, autoplan.shard_batch(batch, plan, device_mesh)))
    loss.backward()
    for fqn, param in model.named_parameters():
        assert format_spec(spec_from_placements(param.placements)) == format_spec(plan.parameters[fqn]), fqn
        local, _ = compute_local_shape_and_global_offset(param.shape, device_mesh, to_placements(plan.parameters[fqn]))
        assert tuple(param.to_local().shape) == tuple(local), fqn
        assert param.grad is not None and param.grad.to_local().shape == param.to_local().shape, fqn


def test_data_dependent_moe_is_one_opaque_region_and_trains(fake_world):
    """A plain-PyTorch MoE whose experts find their tokens with ``torch.where``."""
    path = ROOT / "tests" / "models" / "loop_moe.py"
    loaded = load_model_file(str(path))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"))
    assert plan.opaque_modules == ("experts",)
    assert any("data-dependent" in w and "experts" in w for w in plan.warnings)
    for fqn, spec in plan.parameters.items():
        if fqn.startswith("experts."):  # gathered to whole tensors before the region runs
            assert plan.parameter_uses.get(fqn, spec) == ("R", "R"), fqn

    example = import_model_file(path)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    model = autoplan.apply_plan(example.build_model(), plan, mesh)
    autoplan.training_loss(model(*autoplan.shard_batch(example.example_inputs(), plan, mesh))).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_uneven_sizes_are_never_sharded_unevenly():
    """kv heads 2 < tp 4, vocab 50257, intermediate 90: every sharded dim divides evenly."""
    loaded = load_model_file(example_path("llama_uneven"))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"))
    shapes = {fqn: tuple(p.shape) for fqn, p in loaded.model.named_parameters()}
    for fqn, spec in list(plan.parameters.items()) + list(plan.parameter_uses.items()):
        for axis, placement in enumerate(spec):
            if placement.startswith("S("):
                dim = int(placement[2:-1])
                assert shapes[fqn][dim] % plan.mesh_shape[axis] == 0, (fqn, spec)
