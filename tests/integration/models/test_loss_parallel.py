"""Cross-entropy on logits split by class (``autoplan/dtensor/loss_parallel.py``).

A Llama whose vocabulary is 32 times its width (``tests/models/wide_vocab_llama.py``), planned
on 2x4 under a budget that forces its weights to be sharded, computes its loss on the logits as the
column-parallel ``lm_head`` leaves them, split by class on tp: the plan predicts the
row statistics' all_reduces, one training step on a fake process group runs exactly the
predicted collectives, eagerly and compiled (``torch.compile``), and on 8 gloo processes
loss and gradients match one device. The handlers alone, on 4 gloo processes (2x2), match
``F.cross_entropy`` on whole logits for every reduction, with ignored targets, and give
DTensor's own layouts back.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from zoo import mean_loss_splits_over_the_batch, verify_on_fake_world, weight_sharding_plan

from autoplan._process_group import free_port, process_group
from autoplan._processes import start_ranks
from autoplan.dtensor import overrides
from autoplan.verify.numerics import NumericsJob, check_numerics

WIDE_VOCAB = ROOT / "tests" / "models" / "wide_vocab_llama.py"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def plan():
    # Under the least any plan needs plus 40 % of the model state, weights must be sharded,
    # the head (the largest) first. That is the budget ``forced_plan`` ends at on torch 2.13;
    # on 2.14, whose mean cross-entropy takes the batch whole, ``forced_plan``'s first budget
    # is already met by splitting the embedding alone and gathering the logits.
    return weight_sharding_plan(str(WIDE_VOCAB))


def test_the_forced_plan_computes_the_loss_on_logits_split_by_class(plan):
    # Column-parallel: the head split by class (its rows) on tp, so the logits are too.
    head = plan.parameters["lm_head.weight"]
    assert head[1] == "S(0)", head
    stats = plan.predicted.module_collectives["<root>"]["tp"]["all_reduce"]
    # Per local row (token): two statistics forward, one sum backward (float32); and the loss
    # (a float32 scalar). The rows are split over dp where DTensor runs a mean loss on a batch
    # split (torch 2.13: 128 local rows), else whole (2.14: 256).
    from autoplan.model_file import import_model_file

    model_file = import_model_file(WIDE_VOCAB)
    rows = model_file.BATCH * model_file.SEQ // (2 if mean_loss_splits_over_the_batch() else 1)
    assert stats == {"count": 4, "bytes": 3 * rows * 4 + 4}, stats
    if mean_loss_splits_over_the_batch():
        # torch 2.13: stored FSDP-style on dp as well (split within each tp piece): the
        # head's dp copies are the cheapest bytes to shed (forced budget 4,287,524 bytes).
        assert head == ("_S(0, 4)", "S(0)"), head


def test_one_step_runs_the_predicted_collectives(plan):
    from autoplan.model_file import import_model_file

    module = import_model_file(WIDE_VOCAB)
    torch.manual_seed(0)
    result = verify_on_fake_world(module.build_model(), module.example_inputs(), plan)
    assert result.rows and all(row.predicted == row.observed for row in result.rows), result.rows


@pytest.mark.slow  # compiles the model
def test_the_compiled_model_runs_the_predicted_collectives(plan):
    """Under ``torch.compile`` (whole model) the handlers and their all_reduces trace as they run eagerly."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.model_file import import_model_file
    from autoplan.verify.numerics import build_seeded, seeded_batch
    from autoplan.verify.step_check import verify_plan

    module = import_model_file(WIDE_VOCAB)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        result = verify_plan(build_seeded(module, "build_model", 0), seeded_batch(module, 1), plan, mesh,
                             compile_mode="whole", backend="aot_eager")
    finally:
        dist.destroy_process_group()
    assert result.passed, "\n" + result.summary()


@pytest.mark.gloo
def test_numerics_match_one_device_on_gloo(plan):
    (result,) = check_numerics([NumericsJob(str(WIDE_VOCAB), "build_model", plan.to_json())], world=8)
    assert result.worst <= TOLERANCE, result


REDUCTIONS = ("mean", "sum", "none")


def handlers_worker(rank: int, port: int, result_path: str):
    torch.set_num_threads(1)
    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        logits = torch.randn(16, 12, dtype=torch.float64)
        target = torch.randint(0, 12, (16,))
        target[::5] = -100  # ignored, as HF pads its shifted labels
        found = {}
        for reduction in REDUCTIONS:
            whole = logits.clone().requires_grad_()
            expected = F.cross_entropy(whole, target, reduction=reduction)
            expected.backward(torch.ones_like(expected))
            split = distribute_tensor(logits, mesh, (Shard(0), Shard(1))).requires_grad_()
            labels = distribute_tensor(target, mesh, (Shard(0), Replicate()))
            with overrides.installed():
                loss = F.cross_entropy(split, labels, reduction=reduction)
                loss.backward(torch.ones_like(loss))
            found[reduction] = {
                "loss": (loss.full_tensor() - expected).abs().max().item() / expected.abs().max().item(),
                "grad": (split.grad.full_tensor() - whole.grad).abs().max().item() / whole.grad.abs().max().item(),
                "loss_layout": [str(p) for p in loss.placements],
                "grad_layout": [str(p) for p in split.grad.placements],
            }
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(found, f)


@pytest.mark.gloo
def test_handlers_match_whole_logits_for_every_reduction(tmp_path):
    result = tmp_path / "result.json"
    start_ranks(handlers_worker, (free_port(), str(result)), nprocs=4)
    found = json.loads(result.read_text())
    for reduction in REDUCTIONS:
        outcome = found[reduction]
        assert outcome["loss"] <= 1e-12 and outcome["grad"] <= 1e-12, (reduction, outcome)
        assert outcome["grad_layout"] == ["S(0)", "S(1)"], outcome  # the gradient stays split, nothing gathered
    assert found["none"]["loss_layout"] == ["S(0)", "R"]  # per row: split by batch, whole on tp
    assert found["sum"]["loss_layout"] == ["P(sum)", "R"]  # DTensor's own layout of a batch-split loss


def test_the_handlers_are_in_place_only_while_autoplan_runs():
    """Importing autoplan changes nothing: DTensor's handlers are its own again afterwards."""
    handlers = DTensor._op_dispatcher._custom_op_handlers
    before = dict(handlers)
    with overrides.installed():
        assert torch.ops.aten._log_softmax.default in handlers
    assert handlers == before
