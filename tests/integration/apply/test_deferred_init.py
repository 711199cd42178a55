"""Deferred initialisation: a model built on the meta device gets only its local shards from
``apply_plan(..., init=...)``; ``load_full_state_dict`` then fills them, and on 8 gloo processes
its gradients equal the single-device model's and, after an AdamW step (gradient reduction
hooks still in place), so does its loss."""

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

import autoplan
from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks
from autoplan.errors import InfeasibleError, PlanError
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

LLAMA = EXAMPLES / "llama.py"
BUDGET_GIB = 0.0009  # forces weights to be sharded on both axes of 2x4
LEAST_MARGIN = 1.05  # where BUDGET_GIB is infeasible: the margin it leaves over the least a plan needs on torch 2.13
TOLERANCE = 1e-5
LOSS_TOLERANCE = 1e-4  # after an AdamW step, which divides by sqrt(v) and so magnifies rounding in tiny gradients


def sharded_plan():
    loaded = load_model_file(str(LLAMA))

    def suggest(memory_gib):
        return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), memory_gib=memory_gib, profile="cpu-gloo")

    try:
        return suggest(BUDGET_GIB)
    except InfeasibleError as err:  # torch 2.14's rules need more than 2.13's (0.000910 GiB vs 0.000858 at least)
        return suggest(err.smallest_bytes / 2**30 * LEAST_MARGIN)


@pytest.fixture
def fake_mesh():
    # Rank 0, as in the other fake-PG tests: DTensor's caches keep meshes of earlier fake worlds
    # in this process, which compare equal to a new one of another rank but keep their own
    # coordinates. The gloo test below checks every rank's slice.
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_meta_model_gets_local_shards_only_and_loads_its_slice(fake_mesh):
    plan = sharded_plan()
    model = load_model_file(str(LLAMA)).model
    autoplan.apply_plan(model, plan, fake_mesh, init=model._init_weights)
    reference = build_seeded(import_model_file(LLAMA), "build_model", 0)
    full = reference.state_dict()
    smaller = 0
    for _fqn, param in model.named_parameters():
        assert not param.to_local().is_meta
        smaller += param.to_local().numel() < param.numel()
    assert smaller >= len(plan.parameters) // 2
    assert all(not b.is_meta for b in model.buffers())
    # non-persistent buffers (not in any state dict) are recomputed by the init function
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    autoplan.load_full_state_dict(model, full)
    for fqn, param in model.named_parameters():
        shape, offset = compute_local_shape_and_global_offset(param.shape, fake_mesh, param.placements)
        assert torch.equal(param.to_local(), full[fqn][tuple(slice(o, o + n) for o, n in zip(offset, shape))]), fqn


def test_meta_model_without_init_is_an_error_with_the_fix(fake_mesh):
    plan = sharded_plan()
    model = load_model_file(str(LLAMA)).model
    with pytest.raises(PlanError, match="meta device.*init="):
        autoplan.apply_plan(model, plan, fake_mesh)
    model = load_model_file(str(LLAMA)).model
    with pytest.raises(PlanError, match="no reset_parameters"):
        autoplan.apply_plan(model, plan, fake_mesh, init="reset_parameters")


def test_state_dict_mismatch_names_the_keys(fake_mesh):
    model = build_seeded(import_model_file(LLAMA), "build_model", 0)
    state = model.state_dict()
    state.pop("lm_head.weight")
    with pytest.raises(PlanError, match="missing \\['lm_head.weight'\\]"):
        autoplan.load_full_state_dict(model, state)


def worker(rank: int, port: int, plan_json: str, result_path: str):
    torch.set_num_threads(1)
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=8):
        plan = autoplan.Plan.from_dict(json.loads(plan_json))
        mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
        llama = import_model_file(LLAMA)
        reference = build_seeded(llama, "build_model", 0)
        full_state = copy.deepcopy(reference.state_dict())
        model = load_model_file(str(LLAMA)).model  # on meta
        autoplan.apply_plan(model, plan, mesh, init=model._init_weights)
        autoplan.load_full_state_dict(model, full_state)
        batch = seeded_batch(llama, 1)
        feeds = {"parallel": (model, autoplan.shard_batch(batch, plan, mesh)), "reference": (reference, batch)}
        optimizers = {name: torch.optim.AdamW(net.parameters()) for name, (net, _) in feeds.items()}
        losses = {}
        for step in range(2):
            for name, (net, feed) in feeds.items():
                loss = autoplan.training_loss(net(**feed))
                loss.backward()
                losses[name] = loss.item()
            if step == 0:  # gradients of the first step, before the optimizer touches anything
                ref = dict(reference.named_parameters())
                errors = {
                    fqn: ((p.grad.full_tensor() - ref[fqn].grad).abs().max() / ref[fqn].grad.abs().max()).item()
                    for fqn, p in model.named_parameters()
                }
            for _name, optimizer in optimizers.items():
                optimizer.step()
                optimizer.zero_grad()
        errors["loss after one AdamW step"] = abs(losses["parallel"] - losses["reference"]) / abs(losses["reference"])
        if rank == 0:
            Path(result_path).write_text(json.dumps(errors))


@pytest.mark.gloo
def test_meta_built_model_trains_like_one_device(tmp_path):
    plan = sharded_plan()
    result = tmp_path / "errors.json"
    start_ranks(worker, (free_port(), plan.to_json(), str(result)), nprocs=8)
    errors = json.loads(result.read_text())
    assert len(errors) == 1 + len(plan.parameters)
    loss = errors.pop("loss after one AdamW step")
    worst = max(errors.items(), key=lambda kv: kv[1])
    assert worst[1] <= TOLERANCE, worst
    assert loss <= LOSS_TOLERANCE, loss
