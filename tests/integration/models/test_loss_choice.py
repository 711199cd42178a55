"""The loss autoplan plans, applies, verifies and checks: the model file's ``compute_loss``,
else the model's own (``.loss``, ``["loss"]``, the one scalar of a tuple), else the sum of the
output with one warning (``autoplan/trace/loss.py``).

Models as people write them (``tests/models/``): nanoGPT returning ``(logits, loss)``, the
same model returning a named tuple and a frozen dataclass, and a model returning logits whose
file defines ``compute_loss``. Each is planned on 2x4 under a budget that forces weights to
be sharded, and one training step on a fake process group of 8 ranks runs exactly the
predicted collectives; the applied model returns the loss as a plain tensor, in an output of
the model's own type. On 8 gloo processes the ``compute_loss`` plan matches one device.
"""

import collections
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import ROOT
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from zoo import forced_plan

import autoplan
from autoplan.cli import main
from autoplan.errors import LossError, ModelFileError
from autoplan.model_file import import_model_file, load_model_file, loss_function
from autoplan.trace.loss import find_loss, with_value_at
from autoplan.trace.tracer import trace_model
from autoplan.verify.numerics import NumericsJob, build_seeded, call_model, check_numerics, seeded_batch
from autoplan.verify.step_check import verify_plan

MODELS = ROOT / "tests" / "models"
NANOGPT = MODELS / "nanogpt.py"
LOSS_FN_FILE = MODELS / "logits_with_loss_fn.py"
CASES = {
    "tuple": (NANOGPT, "build_model"),
    "namedtuple": (NANOGPT, "build_namedtuple"),
    "dataclass": (NANOGPT, "build_dataclass"),
    "compute_loss": (LOSS_FN_FILE, "build_model"),
}
NO_LOSS = "the model returns no loss"


# -- the rules, on plain tensors ------------------------------------------------------------

Pair = collections.namedtuple("Pair", ["logits", "loss"])


@dataclasses.dataclass(frozen=True)
class Frozen:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


def test_the_loss_is_the_one_scalar_not_the_first_output():
    logits, loss = torch.ones(2, 3), torch.tensor(0.5)
    assert find_loss((logits, loss)).tensor is loss  # nanoGPT: not logits.sum()
    assert find_loss(Pair(logits, loss)).where == ".loss"
    assert find_loss(Frozen(logits, loss)).tensor is loss
    assert find_loss({"logits": logits, "loss": loss}).where == "['loss']"
    assert find_loss(loss).tensor is loss


def test_an_output_without_a_loss_is_summed_and_says_where():
    found = find_loss((torch.ones(2, 3), None))  # nanoGPT called without targets
    assert found.summed and found.where == "[0]" and found.tensor.item() == 6.0
    assert find_loss(Frozen(torch.ones(2, 2))).where == ".logits"


def test_two_scalars_are_ambiguous_and_the_error_names_the_fix():
    with pytest.raises(LossError) as info:
        find_loss((torch.ones(3), torch.tensor(1.0), torch.tensor(2.0)))
    assert "2 scalar tensors (output[1], output[2])" in str(info.value)
    assert "compute_loss(output, batch)" in str(info.value) and "\n" not in str(info.value)


def test_outputs_are_rebuilt_not_assigned():
    new = torch.tensor(3.0)
    pair, frozen, plain_dict = Pair(torch.ones(1), torch.tensor(1.0)), Frozen(torch.ones(1), torch.tensor(1.0)), {"loss": torch.tensor(1.0)}
    assert type(with_value_at(pair, ".loss", new)) is Pair and with_value_at(pair, ".loss", new).loss is new
    assert type(with_value_at(frozen, ".loss", new)) is Frozen and with_value_at(frozen, ".loss", new).loss is new
    assert with_value_at(plain_dict, "['loss']", new)["loss"] is new
    assert with_value_at((1, torch.tensor(1.0)), "[1]", new) == (1, new)
    assert pair.loss.item() == frozen.loss.item() == plain_dict["loss"].item() == 1.0  # the model's own untouched


# -- planning, one step on a fake process group, the applied model's output ----------------


@pytest.fixture(scope="module")
def plans():
    return {name: forced_plan(f"{path}:{builder}") for name, (path, builder) in CASES.items()}


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


@pytest.mark.parametrize("name", list(CASES))
def test_the_planned_loss_is_the_cross_entropy(name):
    path, builder = CASES[name]
    loaded = load_model_file(f"{path}:{builder}")
    traced = trace_model(loaded.model, loaded.example_inputs, loaded.loss_fn)
    assert not [w for w in traced.warnings if NO_LOSS in w], traced.warnings
    (result,) = next(node for node in traced.graph_module.graph.nodes if node.op == "output").args[0]
    source = result.args[0] if result.target.__name__ == "getitem" else result  # nll_loss_forward returns (loss, weight)
    assert "nll_loss" in str(source.target), source.target


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_runs_the_predicted_collectives_and_returns_a_plain_loss(plans, fake_world, name):
    path, builder = CASES[name]
    plan = plans[name]
    assert plan.predicted.collectives, f"{name}: the forced plan communicates nothing"
    assert not [w for w in plan.warnings if NO_LOSS in w], plan.warnings
    module = import_model_file(path)
    loss_fn = loss_function(module, path)
    model, batch = build_seeded(module, builder, 0), seeded_batch(module, 1)
    result = verify_plan(model, batch, plan, fake_world, loss_fn=loss_fn)
    assert result.passed, "\n" + result.summary()
    assert {(row.axis, row.kind): row.observed for row in result.totals()} == {
        (axis, kind): (entry["count"], entry["bytes"])
        for axis, kinds in plan.predicted.collectives.items()
        for kind, entry in kinds.items()
    }

    output = call_model(model, autoplan.shard_batch(batch, plan, fake_world))
    if name == "compute_loss":  # the applied model returns compute_loss's loss itself
        assert type(output) is torch.Tensor and output.dim() == 0
        return
    reference_type = type(build_seeded(module, builder, 0)(*batch))
    assert type(output) is reference_type
    loss = output[1] if name == "tuple" else output.loss
    logits = output[0] if name == "tuple" else output.logits
    assert type(loss) is torch.Tensor and loss.dim() == 0  # plain, the global value
    assert isinstance(logits, DTensor)
    assert autoplan.training_loss(output) is loss


def test_an_output_summed_for_want_of_a_loss_says_so_once():
    loaded = load_model_file(str(LOSS_FN_FILE))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False)  # compute_loss not passed
    said = [w for w in plan.warnings if NO_LOSS in w]
    assert said == [
        ("the model returns no loss (.loss, ['loss'] or one scalar tensor): the plan is for output.sum(); "
        "define compute_loss(output, batch) in the model file (loss_fn= in Python) to plan for the real loss")
    ]
    with_loss = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False, loss_fn=loaded.loss_fn)
    assert with_loss.fingerprint != plan.fingerprint  # a different step: the cache keeps them apart


# -- bad input: one line, the problem and the fix -------------------------------------------


def _model_file(tmp_path: Path, loss_body: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(LOSS_FN_FILE.read_text().split("def compute_loss")[0] + loss_body)
    return path


def test_a_compute_loss_that_is_not_a_scalar_is_one_line_with_the_fix(tmp_path, capsys):
    path = _model_file(tmp_path, (
        "def compute_loss(output, batch):\n"
        "    return F.cross_entropy(output.flatten(0, 1), batch['targets'].flatten(), reduction='none')\n"
    ))
    loaded = load_model_file(str(path))
    with pytest.raises(LossError, match=r"compute_loss\(output, batch\) returned a tensor of shape \[128\], "
                                        r"expected a scalar \(0-dim\) tensor; fix: reduce it in compute_loss"):
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False, loss_fn=loaded.loss_fn)
    assert main(["suggest", str(path), "--mesh", "2x4", "--out", str(tmp_path / "plan.json"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoplan: error: compute_loss(output, batch) returned a tensor of shape [128]")
    assert len(err.splitlines()) == 1 and not (tmp_path / "plan.json").exists()


def test_a_compute_loss_that_fails_is_named(tmp_path):
    path = _model_file(tmp_path, "def compute_loss(output, batch):\n    return F.cross_entropy(output, batch[1])\n")
    loaded = load_model_file(str(path))
    with pytest.raises(LossError, match=r"^compute_loss\(output, batch\) raised KeyError: 1; fix: fix compute_loss"):
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False, loss_fn=loaded.loss_fn)


def test_a_compute_loss_that_is_not_a_function_is_refused(tmp_path):
    path = _model_file(tmp_path, "compute_loss = 'cross_entropy'\n")
    with pytest.raises(ModelFileError, match="defines compute_loss as a str, not a function"):
        load_model_file(str(path))
    loaded = load_model_file(str(LOSS_FN_FILE))
    with pytest.raises(TypeError, match="expected loss_fn as a function"):
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), loss_fn="cross_entropy")


# -- the command line carries the model file's compute_loss --------------------------------


def test_cli_plans_scores_and_verifies_the_model_files_loss(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["suggest", str(LOSS_FN_FILE), "--mesh", "2x4", "--out", str(plan_path), "--no-cache"]) == 0
    assert NO_LOSS not in capsys.readouterr().out
    # A plan of compute_loss's step: verify and score refuse it unless they trace that step too.
    assert main(["score", str(LOSS_FN_FILE), str(plan_path)]) == 0
    assert main(["verify", str(LOSS_FN_FILE), str(plan_path)]) == 0
    assert "collectives: passed" in capsys.readouterr().out


# -- numerics on gloo ----------------------------------------------------------------------


@pytest.mark.gloo
def test_compute_loss_numerics_match_one_device_on_gloo(plans):
    plan = plans["compute_loss"]
    (result,) = check_numerics([NumericsJob(str(LOSS_FN_FILE), "build_model", plan.to_json())], world=8)
    assert result.worst <= 1e-5, result
    module = import_model_file(LOSS_FN_FILE)
    model, batch = build_seeded(module, "build_model", 0), seeded_batch(module, 1)
    expected = F.cross_entropy(model(**batch).flatten(0, 1), batch["targets"].flatten()).item()
    assert math.isclose(result.reference_loss, expected, rel_tol=1e-6)  # compute_loss's loss, on every rank
