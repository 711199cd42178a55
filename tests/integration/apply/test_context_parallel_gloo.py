"""Issue 48, must-show 2: a Llama with context parallel 4 on gloo at 4096 tokens.

HuggingFace ``LlamaForCausalLM`` (sdpa attention, grouped-query heads), sizes shrunk, one
sequence of 4096 tokens. The plan splits the sequence over a 4-rank context axis
(``pipeline/context_parallel.py``); every rank applies it and runs a training step on its
two load-balanced chunks of the sequence. Loss and every parameter gradient must equal the
single-device model's (max|g - g_ref| / max|g_ref| <= 1e-5, float32); the keys' and values'
all-gathers are the plan's prediction; the plan's predicted peak memory is compared with
torch's ``MemTracker`` on rank 0 over the next step (forward, backward, AdamW).
"""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import autoplan
from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks
from autoplan.pipeline.context_parallel import suggest_context_parallel
from autoplan.sequence_batch import causal_lm_batch

CP = 4
SEQ = 4096
VOCAB = 256
TOLERANCE = 1e-5
MEMORY_ABOVE, MEMORY_BELOW = 0.10, 0.02  # as tests/integration/zoo/test_memory_prediction.py


def build_model():
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SEQ, tie_word_embeddings=False, attn_implementation="sdpa",
    )
    return AutoModelForCausalLM.from_config(config)


def example_inputs():
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (1, SEQ), generator=generator)
    labels = torch.randint(0, VOCAB, (1, SEQ), generator=generator)
    return causal_lm_batch(tokens, labels)


def worker(rank: int, plan_json: str, port: int, result_path: str):
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan.verify.observe import CollectiveCounter

    torch.set_num_threads(1)  # four processes share few cores
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=CP):
        plan = autoplan.Plan.from_dict(json.loads(plan_json))
        torch.manual_seed(0)
        model = build_model()
        reference = copy.deepcopy(model)
        batch = example_inputs()
        mesh = init_device_mesh("cpu", plan.mesh_shape, mesh_dim_names=plan.axis_names)
        autoplan.apply_plan(model, plan, mesh)
        local_batch = autoplan.shard_batch(batch, plan, mesh)
        with CollectiveCounter(model, mesh) as counter:
            loss = autoplan.training_loss(model(**local_batch))
            loss.backward()
        ref_loss = autoplan.training_loss(reference(**batch))
        ref_loss.backward()
        errors = {"loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())}
        ref_params = dict(reference.named_parameters())
        for fqn, param in model.named_parameters():
            grad = param.grad.full_tensor()
            ref = ref_params[fqn].grad
            errors[fqn] = ((grad - ref).abs().max() / ref.abs().max()).item()
        del reference, ref_params, ref_loss
        optimizer = torch.optim.AdamW(model.parameters())
        optimizer.step()  # the warm-up step: AdamW's state exists before the measured one
        optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            autoplan.training_loss(model(**local_batch)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        measured = {str(getattr(k, "name", k)): int(v) for k, v in peak.items()}
        with open(f"{result_path}.{rank}", "w") as f:
            json.dump({"errors": errors, "collectives": counter.table(), "memory": measured}, f)


@pytest.mark.slow
@pytest.mark.gloo
def test_context_parallel_matches_one_device_and_its_prediction(tmp_path):
    with torch.device("meta"):
        model = build_model()
    batch = example_inputs()
    choice = suggest_context_parallel(model, batch, (CP,), ("cp",), "cp", profile="cpu-gloo", compare=False)
    plan = choice.plan
    assert plan.context_parallel is not None and plan.context_parallel.axis == "cp"
    assert plan.inputs["[1]['input_ids']"].placements == ("S(1)",)
    for layer in range(2):  # the layers run on their chunks of the sequence, not gathered
        attention = plan.modules[f"model.layers.{layer}.self_attn"]
        assert attention.inputs["[1]['hidden_states']"] == ("S(1)",), attention
        assert attention.outputs["[0]"] == ("S(1)",), attention
    result = tmp_path / "result.json"
    start_ranks(worker, (plan.to_json(), free_port(), str(result)), nprocs=CP)
    ranks = [json.loads((tmp_path / f"result.json.{rank}").read_text()) for rank in range(CP)]
    found = ranks[0]
    errors = found["errors"]
    assert len(errors) == 1 + len(plan.parameters)
    assert max(errors.values()) <= TOLERANCE, errors

    # The keys' and values' all-gathers, as predicted: per layer, two gathers of the whole sequence.
    predicted = plan.predicted.module_collectives
    for layer in range(2):
        name = f"model.layers.{layer}.self_attn"
        assert found["collectives"][name] == predicted[name]
        assert found["collectives"][name]["cp"]["all_gather"]["count"] == 2

    # The peak over the ranks, less the causal masks a CPU materializes (a GPU's kernels take
    # the lower-right alignment without one): rank r keeps, per layer, a float32 mask of
    # c x (j+1)c for each of its chunks j in (r, 2n-1-r) that sees keys before its own.
    measured = max(r["memory"]["Total"] - cpu_masks(rank) for rank, r in enumerate(ranks))
    ratio = plan.predicted.peak_memory_bytes / measured
    print(f"predicted {plan.predicted.peak_memory_bytes} B, measured less CPU masks {measured} B, ratio {ratio:.3f}")
    assert 1 - MEMORY_BELOW <= ratio <= 1 + MEMORY_ABOVE, (plan.predicted.memory, [r["memory"] for r in ranks])


def cpu_masks(rank: int, layers: int = 2) -> int:
    chunk = SEQ // (2 * CP)
    return layers * sum(chunk * (j + 1) * chunk * 4 for j in (rank, 2 * CP - 1 - rank) if j > 0)
