"""A plan exported with ``autoplan export --format torch`` and applied
with PyTorch's own ``parallelize_module`` gives the same loss, logits and gradients as
autoplan's engine running the plan, on a 1-D tp mesh of 4 gloo processes.

The plan is solved for that mesh with the batch pinned whole (ParallelStyles on tp do not
split the batch) and a budget that makes the solver shard weights: it holds a Megatron
pair (gate/up ColwiseParallel feeding down_proj RowwiseParallel on local shards), and
parts the export writes replicated (an FSDP-style embedding, batch-split activations).
Both recompute layer 0 fully and layer 1 selectively (``Plan.recompute``): the engine by its
own checkpoint, the export by torchtitan's ``checkpoint_wrapper``.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES

import autoplan
from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks
from autoplan.cli import main
from autoplan.interop.export_torch import export_torch
from autoplan.model_file import import_model_file, load_model_file
from autoplan.pipeline.suggest import suggest_with_report
from autoplan.verify.numerics import build_seeded, seeded_batch

WORLD = 4
TOLERANCE = 1e-5
BUDGET_GIB = 0.0025
WHOLE_BATCH = {"[1]['input_ids']": ("R",), "[1]['labels']": ("R",)}
RECOMPUTE = {"model.layers.0": "full", "model.layers.1": "selective"}
WRAPPED = "_checkpoint_wrapped_module."  # what checkpoint_wrapper adds to parameter FQNs


def relative(value, reference) -> float:
    value = value.full_tensor() if hasattr(value, "full_tensor") else value
    return ((value.detach() - reference.detach()).abs().max() / reference.abs().max()).item()


def _engine_step(plan_json: str, exported: str):
    """In a rank of the process group: the tiny Llama's module, the generated one, the plan's
    mesh, the global batch, and the engine running the plan with its step's output (after
    backward): what both workers compare the export against."""
    from torch.distributed.device_mesh import init_device_mesh

    plan = autoplan.Plan.from_dict(json.loads(plan_json))
    generated = import_model_file(Path(exported))
    llama = import_model_file(EXAMPLES / "llama.py")
    mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
    batch = seeded_batch(llama, 1)
    engine = autoplan.apply_plan(build_seeded(llama, "build_model", 0), plan, mesh)
    out = engine(**autoplan.shard_batch(batch, plan, mesh))
    autoplan.training_loss(out).backward()
    return llama, generated, mesh, batch, engine, out


def worker(rank: int, port: int, plan_json: str, exported: str, result_path: str):
    torch.set_num_threads(1)
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD):
        llama, generated, mesh, batch, engine, out = _engine_step(plan_json, exported)
        engine_loss, engine_logits = autoplan.training_loss(out), out.logits

        torch_tp = generated.parallelize(build_seeded(llama, "build_model", 0), mesh)
        out = torch_tp(**batch)  # the export feeds every tp rank the whole batch
        out.loss.backward()

        errors = {"loss": abs(out.loss.item() - engine_loss.item()) / abs(engine_loss.item())}
        errors["logits"] = relative(out.logits, engine_logits.full_tensor())
        torch_params = {fqn.replace(WRAPPED, ""): p for fqn, p in torch_tp.named_parameters()}
        for fqn, param in engine.named_parameters():
            errors[fqn] = relative(torch_params[fqn].grad, param.grad.full_tensor())
        styled = sum(type(p).__name__ == "DTensor" for p in torch_params.values())
        wrapped = sorted(fqn for fqn, m in torch_tp.named_modules() if type(m).__name__ == "CheckpointWrapper")
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump({"errors": errors, "dtensor_parameters": styled, "checkpointed": wrapped}, f)


@pytest.mark.gloo
def test_exported_parallelize_module_plan_matches_the_engine(tmp_path, capsys):
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan, _ = suggest_with_report(
        loaded.model, loaded.example_inputs, (WORLD,), ("tp",), "cpu-gloo", None, None, WHOLE_BATCH, memory_gib=BUDGET_GIB
    )
    plan = replace(plan, recompute=RECOMPUTE)
    plan_path = plan.save(tmp_path / "llama-tp4.json")
    exported = tmp_path / "llama_tp4_torch.py"
    assert main(["export", str(plan_path), "--format", "torch", "--out", str(exported)]) == 0
    printed = capsys.readouterr().out
    assert "not expressed: " in printed  # this plan has parts ParallelStyles cannot hold

    styles = export_torch(plan).styles
    assert any(s.startswith("ColwiseParallel") and "output_layouts=Shard(-1)" in s for s in styles.values()), styles
    assert any(s.startswith("RowwiseParallel") and "input_layouts=Shard(-1)" in s for s in styles.values()), styles

    result = tmp_path / "errors.json"
    start_ranks(worker, (free_port(), plan.to_json(), str(exported), str(result)), nprocs=WORLD)
    outcome = json.loads(result.read_text())
    assert outcome["dtensor_parameters"] == len(styles)  # every styled module holds DTensor weights
    assert outcome["checkpointed"] == sorted(RECOMPUTE)
    errors = outcome["errors"]
    assert len(errors) == 2 + len(plan.parameters)
    worst = max(errors.items(), key=lambda kv: kv[1])
    assert worst[1] <= TOLERANCE, worst


DP_WORLD = 4  # a 2x2 (dp, tp) mesh


def data_parallel_worker(rank: int, port: int, plan_json: str, exported: str, result_path: str):
    import torch.distributed as dist

    torch.set_num_threads(1)
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=DP_WORLD):
        llama, generated, mesh, batch, engine, out = _engine_step(plan_json, exported)
        engine_loss = autoplan.training_loss(out)

        exported_model = generated.parallelize(build_seeded(llama, "build_model", 0), mesh)
        dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
        rows = next(iter(batch.values())).shape[0] // dp_size
        mine = {k: v[dp_rank * rows:(dp_rank + 1) * rows] for k, v in batch.items()}  # replicate / fully_shard: own samples
        loss = exported_model(**mine).loss
        loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=mesh["dp"].get_group())  # every sample counts alike: the mean of the means
        mean_loss /= dp_size

        errors = {"loss": abs(mean_loss.item() - engine_loss.item()) / abs(engine_loss.item())}
        exported_params = dict(exported_model.named_parameters())
        for fqn, param in engine.named_parameters():
            errors[fqn] = relative(exported_params[fqn].grad, param.grad.full_tensor())
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump({"errors": errors}, f)


@pytest.mark.gloo
def test_exported_replicate_and_fully_shard_match_the_engine(tmp_path):
    """On a 2x2 (dp, tp) mesh of 4 gloo processes: Megatron on tp, the layers replicated on dp
    (``replicate``) and the embedding and head stored split on dp (``fully_shard`` on the
    plan's dim): the same loss and gradients as the engine running the plan."""
    from autoplan.evaluate.baselines import build_baseline

    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan = build_baseline("megatron", loaded.model, loaded.example_inputs, (2, 2), ("dp", "tp"), "cpu-gloo").plan
    # the embedding and the head stored split by hidden size on dp (FSDP-style: gathered for use)
    split = {"model.embed_tokens.weight": "S(1)", "lm_head.weight": "S(1)"}
    parameters = {f: (split.get(f, s[0]), s[1]) for f, s in plan.parameters.items()}
    plan = replace(plan, parameters=parameters,
                   parameter_uses={**plan.parameter_uses, **{f: ("R", plan.parameters[f][1]) for f in split}})
    export = export_torch(plan)
    assert export.data_parallel.shard_dims == dict.fromkeys(split, 1) and export.data_parallel.replicate
    exported = tmp_path / "llama_2x2_torch.py"
    exported.write_text(export.source)

    result = tmp_path / "errors.json"
    start_ranks(data_parallel_worker, (free_port(), plan.to_json(), str(exported), str(result)), nprocs=DP_WORLD)
    outcome = json.loads(result.read_text())
    errors = outcome["errors"]
    assert len(errors) == 1 + len(plan.parameters)
    worst = max(errors.items(), key=lambda kv: kv[1])
    assert worst[1] <= TOLERANCE, worst
