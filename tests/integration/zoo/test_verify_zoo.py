"""``autoplan verify`` passes for every public-zoo model on meshes (8),
(2,4) and (2,2,2): one training step (forward, backward, AdamW) on a fake process group of
8 ranks runs exactly the collectives the plan predicts, in count and bytes per module,
mesh axis and kind (the per-module rows say where each ran). Plans are made under a budget that forces half the model state to be
sharded, so they gather, reduce and reshard for real. The uneven Llama and the MoE run on
2x4 too.

Also: the counter itself on a hand-made DTensor program, and the command line (a passing
plan exits 0, a plan whose prediction was edited exits 1 naming the module).

Under the ``cpu-gloo`` profile: the plan ``examples/train.py`` trains with (the tiny Llama
on 2x4 at its test's budget) runs exactly its prediction, module by module; its
attention flattens head-split tensors (planned gathered) and, where DTensor runs a mean
loss on a batch split (torch 2.13; 2.14 has no rule for it), its loss is split over the
batch on tp (the loss and its count of targets are all-reduced). And the MoE's forced plan
on 2x4: its router normalises the top-k weights in place (``div_``), which DTensor runs
where the weights are.
"""

import functools
import json

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES
from test_train_example import BUDGET_GIB
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from zoo import MESHES, PUBLIC_ZOO, example_path, forced_plan, mean_loss_splits_over_the_batch, verify_on_fake_world

import autoplan
from autoplan.cli import main
from autoplan.cost.comm import redistribute_collectives
from autoplan.model_file import import_model_file
from autoplan.placements import candidate_specs, is_partial, local_shape, to_placements
from autoplan.verify.numerics import build_seeded, seeded_batch
from autoplan.verify.observe import CollectiveCounter
from autoplan.verify.step_check import as_on_cpu

TRAIN_BUDGET_GIB = float(BUDGET_GIB)  # examples/train.py's budget in its test

CASES = [
    pytest.param(
        name, mesh, id=f"{name}-{'x'.join(map(str, mesh))}",
        marks=[pytest.mark.slow] if len(mesh) == 3 else [],  # 3-D meshes take seconds each
    )
    for name, mesh in [*((n, m) for n in PUBLIC_ZOO for m in MESHES), ("llama_uneven", (2, 4)), ("moe", (2, 4))]
]


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


def test_counter_sees_each_collective_with_its_axis_and_bytes(fake_world):
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    holder = torch.nn.Linear(1, 1)
    x = distribute_tensor(torch.randn(16, 32), mesh, [Shard(0), Shard(1)])  # local 8 x 8 float32: 256 B
    partial = DTensor.from_local(torch.randn(16, 8), mesh, [Partial(), Shard(1)])  # local 16 x 8: 512 B
    with CollectiveCounter(holder, mesh) as counter:
        x.redistribute(mesh, [Shard(0), Replicate()])  # all_gather on tp: 8 x 32 gathered, 1024 B
        partial.redistribute(mesh, [Replicate(), Shard(1)])  # all_reduce on dp: 512 B
        partial.redistribute(mesh, [Shard(0), Shard(1)])  # reduce_scatter on dp: 512 B in
        # DTensor's order: innermost axis first, tp (1024 B out), then dp (2048 B out)
        x.redistribute(mesh, [Replicate(), Replicate()])
    table = counter.table()["<root>"]
    assert table == {
        "tp": {"all_gather": {"count": 2, "bytes": 1024 + 1024}},
        "dp": {
            "all_gather": {"count": 1, "bytes": 2048},
            "all_reduce": {"count": 1, "bytes": 512},
            "reduce_scatter": {"count": 1, "bytes": 512},
        },
    }


@pytest.mark.parametrize("name,mesh", CASES)
def test_one_training_step_runs_the_predicted_collectives(name, mesh):
    """The real step runs the prediction; and ``autoplan verify``'s count on fake tensors
    (``verify/fake_model.py``) is that of the real step, row by row, with no fallback."""
    axis_names = MESHES[mesh]
    plan = forced_plan(example_path(name), mesh, axis_names)
    assert plan.predicted.collectives, f"{name}: the forced plan communicates nothing"
    result, fake = _verify_both(name, plan)
    assert result.passed, "\n" + result.summary()
    assert fake.tensors == "fake", fake.fallback
    assert _observed(fake) == _observed(result)
    assert fake.passed, "\n" + fake.summary()
    totals = {(row.axis, row.kind): row.observed for row in result.totals()}
    # the plan's totals as DTensor runs them on this CPU mesh (an all_to_all is an all_gather there)
    sizes = dict(zip(plan.axis_names, plan.mesh_shape))
    predicted = as_on_cpu({"<root>": plan.predicted.collectives}, sizes).get("<root>", {})
    assert totals == {
        (axis, kind): (entry["count"], entry["bytes"])
        for axis, kinds in predicted.items()
        for kind, entry in kinds.items()
    }


def _verify(example_name: str, plan, tensors: str = "real"):
    example = import_model_file(EXAMPLES / f"{example_name}.py")
    model, batch = build_seeded(example, "build_model", 0), seeded_batch(example, 1)
    return verify_on_fake_world(model, batch, plan, tensors=tensors)


def _verify_both(example_name: str, plan):
    """The step counted on real tensors, then on fake ones (``tensors="fake"``)."""
    return _verify(example_name, plan), _verify(example_name, plan, tensors="fake")


def _observed(result):
    return [(row.module, row.axis, row.kind, row.observed) for row in result.rows]


@pytest.mark.slow
def test_the_train_example_plan_runs_exactly_its_prediction():
    example = import_model_file(EXAMPLES / "llama.py")
    with torch.device("meta"):  # as examples/train.py plans
        model, batch = example.build_model(), example.example_inputs()
    plan = autoplan.suggest(
        model, batch, mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo", memory_gib=TRAIN_BUDGET_GIB, cache=False
    )
    labels = plan.inputs["[1]['labels']"].placements
    if mean_loss_splits_over_the_batch():  # torch 2.13's DTensor: the loss is split over the batch on tp
        assert labels[1] == "S(0)", labels
        root = plan.predicted.module_collectives["<root>"]["tp"]["all_reduce"]
        assert root == {"count": 2, "bytes": 8}  # the loss and nll_loss's count of targets, 4 B each
    else:  # torch 2.14's has no such rule: the loss runs with the batch whole on tp, reducing no partial loss
        root = plan.predicted.module_collectives["<root>"].get("tp", {})
        assert "all_reduce" not in root, root
        if labels[1] == "S(0)":  # labels split over the batch (2.14.1 at this budget): gathered for the loss
            assert root.get("all_gather", {}).get("count", 0) >= 1, root
    result = _verify("llama", plan)
    assert result.passed and not result.moved, "\n" + result.summary(all_rows=True)


def test_the_moe_router_runs_its_in_place_division_as_planned():
    plan = forced_plan(example_path("moe"), (2, 4), ("dp", "tp"), profile="cpu-gloo")
    assert not [w for w in plan.warnings if "in-place" in w], plan.warnings
    result = _verify("moe", plan)
    assert result.passed and not result.moved, "\n" + result.summary(all_rows=True)


def test_cli_verify_passes_and_fails_on_an_edited_prediction(tmp_path, capsys):
    plan = forced_plan(example_path("mlp"), (2, 4), ("dp", "tp"))
    good = tmp_path / "mlp.json"
    plan.save(good)
    assert main(["verify", example_path("mlp"), str(good)]) == 0
    out = capsys.readouterr().out
    assert "collectives: passed" in out and "fake process group of 8 ranks" in out

    data = json.loads(good.read_text())
    module, per_axis = next(iter(sorted(data["predicted"]["module_collectives"].items())))
    _axis, per_kind = next(iter(sorted(per_axis.items())))
    kind = next(iter(sorted(per_kind)))
    per_kind[kind]["count"] += 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    assert main(["verify", example_path("mlp"), str(edited)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "FAILED" in out
    assert any(line.startswith(module) and kind in line and "differs" in line for line in out.splitlines())


def test_cli_verify_refuses_a_plan_for_another_model(tmp_path, capsys):
    plan = forced_plan(example_path("mlp"), (2, 4), ("dp", "tp"))
    path = tmp_path / "mlp.json"
    plan.save(path)
    assert main(["verify", example_path("cnn"), str(path)]) == 2
    assert "does not match the model" in capsys.readouterr().err


@pytest.mark.parametrize("mesh_shape", [pytest.param((2, 4), id="2x4"), pytest.param((2, 2, 2), id="2x2x2", marks=pytest.mark.slow)])
def test_priced_redistributions_are_the_ones_dtensor_runs(fake_world, mesh_shape):
    """Every move between layouts of a 8 x 16 x 4 tensor: the collectives ``cost/comm.py`` prices
    (kind, axis, bytes, in DTensor's order of axes) are the ones DTensor performs."""
    names = ("a", "b", "c")[: len(mesh_shape)]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    shape = (8, 16, 4)
    specs = candidate_specs(shape, mesh_shape, partial=True)
    holder = torch.nn.Linear(1, 1)
    checked = 0
    for src in specs:
        for dst in specs:
            if any(is_partial(d) and d != s for s, d in zip(src, dst)):
                continue  # DTensor never redistributes into Partial
            value = DTensor.from_local(
                torch.zeros(local_shape(shape, src, mesh_shape)), mesh, to_placements(src), shape=shape,
                stride=(64, 4, 1), run_check=False,
            )
            with CollectiveCounter(holder, mesh) as counter:
                value.redistribute(mesh, to_placements(dst))
            observed = sorted((c.kind, c.axis, c.nbytes) for c, n in counter.collectives.items() for _ in range(n))
            priced = sorted(
                ("all_gather", names[axis], int(nbytes * mesh_shape[axis])) if kind == "all_to_all" else (kind, names[axis], int(nbytes))
                for kind, axis, nbytes, _ in redistribute_collectives(src, dst, 8 * 16 * 4 * 4, mesh_shape, backward=False)
            )  # a CPU mesh all-gathers where a GPU one would all_to_all
            assert observed == priced, (src, dst)
            checked += 1
    assert checked > 100


@pytest.mark.gloo
def test_cli_verify_numerics_compares_with_one_device_on_gloo(tmp_path, capsys):
    plan = forced_plan(example_path("mlp"), (2, 4), ("dp", "tp"))
    path = tmp_path / "mlp.json"
    plan.save(path)
    assert main(["verify", example_path("mlp"), str(path), "--numerics"]) == 0
    out = capsys.readouterr().out
    assert "collectives: passed" in out
    assert "numerics on 8 gloo processes" in out and "(ok)" in out


BASELINE_CASES = [(model, baseline) for model in ("transformer", "gpt2", "llama") for baseline in ("data_parallel", "megatron")]


@pytest.mark.parametrize("model,baseline", BASELINE_CASES, ids=[f"{m}-{b}" for m, b in BASELINE_CASES])
def test_baseline_plans_run_their_prediction(model, baseline):
    """A baseline (``autoplan.evaluate.baselines``, built as ``benchmarks/fidelity.py`` builds it) on
    2x4 runs exactly its prediction. GPT-2's position ids (made in the model, batch 1) are
    split on dp for its position embedding and gathered where they meet the batch-split
    token embeddings: DTensor must gather them whole, not split both on the idle tp axis
    to gather a quarter (``dtensor/strategy_choice.py``), and the embedding must look them up
    split as planned, plain integer tensor though they are. Llama's rotary cos and sin,
    split likewise, are gathered for ``q * cos`` once: the product's backward reuses the
    gathered ``cos`` (``dtensor/saved_inputs.py``)."""
    from autoplan.evaluate.baselines import baseline_for_problem

    plan = baseline_for_problem(baseline, _baseline_problem(model)).plan
    result = _verify(model, plan)
    assert result.passed, "\n" + result.summary()


@functools.cache
def _baseline_problem(model: str):
    """The model's problem on 2x4, prepared once for both its baselines, as ``benchmarks/fidelity.py``
    builds every baseline of a model from one (``baseline_for_problem``: trace once)."""
    from autoplan.model_file import load_model_file
    from autoplan.pipeline.problem import prepare_problem

    loaded = load_model_file(example_path(model))
    return prepare_problem(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo")
