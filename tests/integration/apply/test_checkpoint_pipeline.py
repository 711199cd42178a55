"""DCP checkpoints between plans that cut the model into other pipeline stages.

On 4 gloo ranks, the eight-layer Llama in float64 runs one AdamW step under plan A (pp 2 x
tp 2, 1F1B, stages split after layer 3) and is saved with ``save_checkpoint``; a model
with other random weights under plan B (pp 2 x tp 2, Interleaved1F1B, four stages cut
elsewhere, two per rank) loads it with ``load_checkpoint``. Every parameter and AdamW
state tensor loaded equals the saved one bit for bit, gathered over all ranks, and plan B's
next step gives the single-device model's loss after the same two steps.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT
from zoo import forced_plan

import autoplan
from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks
from autoplan.model_file import import_model_file
from autoplan.plan.pipeline_plan import PipelinePlan, Stage
from autoplan.verify.numerics import build_seeded, full_mesh, seeded_batch

LLAMA = ROOT / "tests" / "models" / "pipeline_llama.py"
LAYERS = [f"model.layers.{i}" for i in range(8)]
LR = 1e-3
DTYPE = torch.float64  # the check is about the checkpoint, not about rounding (see test_checkpoint_dcp.py)
LOSS_TOLERANCE = 1e-6


def plans() -> tuple[str, str]:
    layout = forced_plan(str(LLAMA), (2,), ("tp",))
    a = (Stage(("model.embed_tokens", *LAYERS[:4]), 0), Stage((*LAYERS[4:], "model.norm", "lm_head"), 1))
    b_modules = [("model.embed_tokens", *LAYERS[:2]), LAYERS[2:4], LAYERS[4:6], (*LAYERS[6:], "model.norm", "lm_head")]
    b = tuple(Stage(tuple(m), i % 2) for i, m in enumerate(b_modules))
    plan_a = dataclasses.replace(layout, pipeline=PipelinePlan("pp", 2, 0, "1F1B", 2, a))
    plan_b = dataclasses.replace(layout, pipeline=PipelinePlan("pp", 2, 0, "Interleaved1F1B", 2, b))
    return plan_a.to_json(), plan_b.to_json()


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def gathered_state(pipelined, optimizer) -> dict[str, torch.Tensor]:
    """Every parameter and AdamW state tensor of every rank's stages, whole."""
    state = {}
    for fqn, param in pipelined.checkpoint_view().named_parameters():
        state[fqn] = full(param).detach().clone()
        for name, value in optimizer.state[param].items():
            state[f"{name} {fqn}"] = full(value).clone()
    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, state)
    return {key: value for rank_state in found for key, value in rank_state.items()}


def worker(rank: int, port: int, plan_jsons: tuple[str, str], checkpoint: str, result_path: str):
    torch.set_num_threads(1)
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4):
        plan_a, plan_b = (autoplan.Plan.from_dict(json.loads(text)) for text in plan_jsons)
        mesh = full_mesh(plan_a)
        llama = import_model_file(LLAMA)
        batches = [seeded_batch(llama, 1 + step) for step in range(2)]

        pipelined = autoplan.apply_plan(build_seeded(llama, "build_model", 0).to(DTYPE), plan_a, mesh)
        optimizer = torch.optim.AdamW(pipelined.parameters(), lr=LR)
        pipelined.step(batches[0])
        optimizer.step()
        optimizer.zero_grad()
        autoplan.save_checkpoint(pipelined, optimizer, checkpoint)
        saved = gathered_state(pipelined, optimizer)
        del pipelined, optimizer

        torch.manual_seed(1000 + rank)  # plan B's model starts from other random weights
        pipelined = autoplan.apply_plan(llama.build_model().to(DTYPE), plan_b, mesh)
        optimizer = torch.optim.AdamW(pipelined.parameters(), lr=LR)
        before = {fqn: full(p).detach().clone() for fqn, p in pipelined.checkpoint_view().named_parameters()}
        autoplan.load_checkpoint(pipelined, optimizer, checkpoint)
        loaded = gathered_state(pipelined, optimizer)
        differed = sum(not torch.equal(value, saved[fqn]) for fqn, value in before.items())
        loss = pipelined.step(batches[1])
        found: list = [None] * dist.get_world_size()
        dist.all_gather_object(found, None if loss is None else loss.item())

        if rank == 0:
            reference = build_seeded(llama, "build_model", 0).to(DTYPE)
            ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
            autoplan.training_loss(reference(**batches[0])).backward()
            ref_optimizer.step()
            ref_loss = autoplan.training_loss(reference(**batches[1])).item()
            result = {
                "keys_saved": sorted(saved), "keys_loaded": sorted(loaded),
                "unequal": sorted(key for key in saved if key in loaded and not torch.equal(saved[key], loaded[key])),
                "differed_before_load": differed,
                "losses": [value for value in found if value is not None], "reference_loss": ref_loss,
            }
            Path(result_path).write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.gloo
def test_checkpoint_moves_between_plans_with_other_stages(tmp_path):
    result_path = tmp_path / "result.json"
    start_ranks(worker, (free_port(), plans(), str(tmp_path / "ckpt"), str(result_path)), nprocs=4)
    result = json.loads(result_path.read_text())
    assert result["keys_saved"] == result["keys_loaded"]
    assert any(key.startswith("exp_avg ") for key in result["keys_saved"])
    assert result["differed_before_load"] > 0, "plan B's model started from the saved weights: the load proves nothing"
    assert result["unequal"] == []
    assert result["losses"]
    for loss in result["losses"]:
        assert abs(loss - result["reference_loss"]) / abs(result["reference_loss"]) <= LOSS_TOLERANCE, (loss, result)
