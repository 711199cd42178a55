"""``verify`` counts the collectives of a planned step on fake tensors at the real shapes
(``verify/fake_model.py``): the same counts as on real tensors (for every zoo plan too:
``test_verify_zoo.py`` counts each both ways), with no real weight
allocated, and the model the caller passed left as it was. A step that reads tensor
values counts on real tensors instead and says why. Long commands report their stages
on stderr (``AUTOPLAN_PROGRESS=plain`` in a log), leaving stdout as it was.
"""


import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES, ROOT
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from zoo import example_path, forced_plan

import autoplan
from autoplan.cli import main
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.fake_model import fake_twin
from autoplan.verify.numerics import build_seeded, seeded_batch
from autoplan.verify.step_check import verify_plan


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


def _observed(result):
    return [(row.module, row.axis, row.kind, row.observed) for row in result.rows]


def _weights_seen_in_forward(model):
    """A forward pre-hook on ``model`` noting, at each call, whether every parameter of the
    module it runs on (the twin, which copies the hook) holds fake local tensors."""
    seen = []

    def note(module, args):
        seen.append(all(isinstance(p.to_local() if hasattr(p, "to_local") else p, FakeTensor) for p in module.parameters()))

    model.register_forward_pre_hook(note)
    return seen


def test_bert_counts_on_fake_tensors_exactly_what_real_ones_run(fake_world):
    """BERT (tied decoder, a padding mask read from the batch): the count on fake tensors
    is the prediction and equals the count on real tensors, row by row."""
    plan = forced_plan(example_path("bert"), (2, 4), ("dp", "tp"))
    example = import_model_file(EXAMPLES / "bert.py")
    model, batch = build_seeded(example, "build_model", 0), seeded_batch(example, 1)
    before = {fqn: p.detach().clone() for fqn, p in model.named_parameters()}
    seen = _weights_seen_in_forward(model)

    fake = verify_plan(model, batch, plan, fake_world, tensors="fake")
    assert fake.tensors == "fake" and not fake.fallback
    assert seen == [True], "the counted step must run on fake weights"
    assert fake.passed, "\n" + fake.summary()
    # the model passed is untouched: still plain tensors, the same values
    for fqn, param in model.named_parameters():
        assert type(param.data) is torch.Tensor and torch.equal(param.detach(), before[fqn]), fqn

    real = verify_plan(model, batch, plan, fake_world, tensors="real")
    assert real.tensors == "real" and seen == [True, False]
    assert _observed(fake) == _observed(real)
    assert real.loss == real.loss and fake.loss != fake.loss  # a real loss; NaN on fake tensors


def test_a_model_built_on_meta_is_counted_without_real_weights(fake_world):
    """As the command line runs it: the model built on meta, its twin fake; no parameter of
    either ever holds real storage."""
    plan = forced_plan(example_path("gpt2"), (2, 4), ("dp", "tp"))
    example = import_model_file(EXAMPLES / "gpt2.py")
    with torch.device("meta"):
        model = build_seeded(example, "build_model", 0)
    seen = _weights_seen_in_forward(model)
    result = verify_plan(model, seeded_batch(example, 1), plan, fake_world, tensors="fake")
    assert result.tensors == "fake" and seen == [True]
    assert result.passed, "\n" + result.summary()
    assert all(p.is_meta for p in model.parameters())

    twin = fake_twin(model)
    assert all(isinstance(p, FakeTensor) for p in twin.parameters())
    assert twin.lm_head.weight is twin.transformer.wte.weight  # tied weights stay tied


def test_a_step_that_reads_values_counts_on_real_tensors_and_says_why(fake_world):
    """The loop MoE finds each expert's tokens with ``torch.where``: a shape from the data,
    which a fake tensor cannot give. The count runs on real tensors, and still matches."""
    path = ROOT / "tests" / "models" / "loop_moe.py"
    loaded = load_model_file(str(path))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"), cache=False)
    example = import_model_file(path)
    torch.manual_seed(0)
    model = example.build_model()
    result = verify_plan(model, example.example_inputs(), plan, fake_world, tensors="fake")
    assert result.tensors == "real" and "reads tensor values" in result.fallback, result.fallback
    assert result.passed, "\n" + result.summary()
    with torch.device("meta"):
        shapes_only = example.build_model()
    rebuilt = verify_plan(shapes_only, example.example_inputs(), plan, fake_world, tensors="fake",
                          real_model=example.build_model)
    assert rebuilt.tensors == "real" and _observed(rebuilt) == _observed(result)


def test_cli_verify_reports_its_stages_on_stderr_and_keeps_stdout(tmp_path, capsys, monkeypatch):
    plan = forced_plan(example_path("mlp"), (2, 4), ("dp", "tp"))
    path = tmp_path / "mlp.json"
    plan.save(path)
    capsys.readouterr()
    assert main(["verify", example_path("mlp"), str(path)]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""  # a pipe gets no progress by default

    monkeypatch.setenv("AUTOPLAN_PROGRESS", "plain")
    assert main(["verify", example_path("mlp"), str(path)]) == 0
    shown = capsys.readouterr()
    assert shown.out == quiet.out
    stages = [line for line in shown.err.splitlines() if line.startswith("autoplan: [0:")]
    assert any("tracing the model" in line for line in stages), shown.err
    assert any("one training step on fake tensors" in line for line in stages), shown.err

    monkeypatch.setenv("AUTOPLAN_PROGRESS", "off")
    assert main(["verify", example_path("mlp"), str(path)]) == 0
    assert capsys.readouterr().err == ""
