"""``autoplan export``: the veScale dict holds the plan's layouts, the torch export maps
Megatron-shaped parameters to ParallelStyles and lists the rest, and the generated module
runs (tp styles + fully_shard) on a 2x4 fake process group."""

import json

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.cli import main
from autoplan.evaluate.baselines import build_baseline
from autoplan.interop.export_torch import export_torch
from autoplan.interop.export_vescale import export_vescale
from autoplan.model_file import import_model_file, load_model_file
from autoplan.plan.module_plan import ModuleLayout, Plan, Predicted, SolverReport
from autoplan.verify.numerics import build_seeded, seeded_batch
from conftest import EXAMPLES


def hand_plan(**changes) -> Plan:
    """A 1-D tp plan of an MLP block: fc1 column-split, fc2 row-split, the hidden split between."""
    base = dict(
        mesh_shape=(4,), axis_names=("tp",),
        parameters={"mlp.fc1.weight": ("S(0)",), "mlp.fc1.bias": ("S(0)",), "mlp.fc2.weight": ("S(1)",), "mlp.fc2.bias": ("R",), "norm.weight": ("R",)},
        modules={
            "mlp": ModuleLayout({"[0][0]": ("R",)}, {"": ("R",)}),
            "mlp.fc1": ModuleLayout({"[0][0]": ("R",)}, {"": ("S(1)",)}),
            "mlp.act": ModuleLayout({"[0][0]": ("S(1)",)}, {"": ("S(1)",)}),
            "mlp.fc2": ModuleLayout({"[0][0]": ("S(1)",)}, {"": ("R",)}),
            "norm": ModuleLayout({"[0][0]": ("S(0)",)}, {"": ("S(0)",)}),
        },
        inputs={}, predicted=Predicted(1.0, 1.0, 0.0, 1, 1, 0), profile="p", fingerprint="f",
        solver=SolverReport("optimal", 1.0, 1.0, 0.0),
        module_types={"mlp.fc1": "Linear", "mlp.fc2": "Linear", "norm": "LayerNorm"},
    )
    base.update(changes)
    return Plan(**base)


def test_megatron_pair_becomes_colwise_and_rowwise_on_local_shards():
    export = export_torch(hand_plan())
    assert export.styles == {
        "mlp.fc1": "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1))",
        "mlp.fc2": "RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())",
    }
    # the hidden layout between the pair is reproduced; the batch-split norm is not
    assert len(export.not_expressed) == 1 and "2 activation layouts" in export.not_expressed[0]
    assert "norm input [0][0] S(0) -> Replicate()" in export.source
    compile(export.source, "generated.py", "exec")


def test_unexpressible_parameters_are_listed_and_replicated():
    plan = hand_plan(
        parameters={"mlp.fc1.weight": ("S(0)",), "mlp.fc1.bias": ("R",), "mlp.fc2.weight": ("S(1)",), "mlp.fc2.bias": ("R",), "norm.weight": ("S(0)",)},
        parameter_uses={"mlp.fc2.weight": ("R",)},
    )
    export = export_torch(plan)
    assert export.styles == {}  # fc1's replicated bias fits no style; fc2 is used whole
    notes = "\n".join(export.not_expressed)
    assert "mlp.fc1 (Linear): bias R, weight S(0) on tp has no ParallelStyle" in notes
    assert "mlp.fc2.weight: stored S(1) on tp and gathered to R for use (FSDP-style)" in notes
    assert "norm (LayerNorm): weight S(0) on tp has no ParallelStyle" in notes


def test_vescale_dict_holds_parameters_and_module_layouts():
    export = export_vescale(hand_plan(modules={
        "mlp.fc1": ModuleLayout({"[0][0]": ("R",)}, {"": ("S(1)",)}),
        "attn": ModuleLayout(
            {"[1]['hidden_states']": ("S(0)",), "[1]['pos'][0]": ("R",), "[1]['pos'][1]": ("S(1)",), "[1]['x'][0][0]": ("R",)},
            {"[0]": ("S(0)",), "[1]": ("R",)},
        ),
    }))
    assert export.plan["parameter"][r"mlp\.fc1.weight"] == ["Shard(0)"]
    assert export.plan["parameter"][r"mlp\.fc2.bias"] == ["Replicate()"]
    assert export.plan["forward"] == {
        r"mlp\.fc1.input": [["Replicate()"]],
        r"mlp\.fc1.output": [["Shard(1)"]],
        "attn.input": {"hidden_states": ["Shard(0)"], "pos": [["Replicate()"], ["Shard(1)"]]},
        "attn.output": [["Shard(0)"], ["Replicate()"]],
    }
    assert any("attn input [1]['x'][0][0]: a nested input" in note for note in export.not_expressed)
    assert any("batch layout" in note for note in export.not_expressed)


def test_cli_writes_both_formats(tmp_path, capsys):
    plan_path = hand_plan().save(tmp_path / "mlp-4.json")
    assert main(["export", str(plan_path), "--format", "vescale"]) == 0
    written = json.loads((tmp_path / "mlp-4.vescale.json").read_text())
    assert set(written) == {"parameter", "forward"}
    assert main(["export", str(plan_path), "--format", "torch"]) == 0
    out = capsys.readouterr().out
    assert "2 ParallelStyles on tp" in out and "not expressed: 2 activation layouts" in out
    assert (tmp_path / "mlp_4_torch.py").read_text() == export_torch(hand_plan(), "mlp-4.json").source
    assert main(["export", str(tmp_path / "missing.json"), "--format", "torch"]) == 2
    assert "no plan file" in capsys.readouterr().err


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield
    dist.destroy_process_group()


def test_generated_module_runs_tp_and_fully_shard_on_a_2x4_mesh(tmp_path, fake_world):
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    # torchtitan's layout on tp plus FSDP on dp; the MLPs compute split on tp
    plan = build_baseline("megatron_fsdp", loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo").plan
    export = export_torch(plan)
    assert export.styles and export.fsdp_modules[-1] == ""
    path = tmp_path / "generated.py"
    path.write_text(export.source)
    generated = import_model_file(path)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    llama = import_model_file(EXAMPLES / "llama.py")
    model = generated.parallelize(build_seeded(llama, "build_model", 0), mesh)
    batch = {k: v[:4] for k, v in seeded_batch(llama, 1).items()}  # this dp rank's half
    model(**batch).loss.backward()
    for fqn, style in export.styles.items():
        weight = model.get_submodule(fqn).weight
        colwise, linear = style.startswith("Colwise"), plan.module_types[fqn] == "Linear"
        assert weight.placements[1].is_shard(0 if colwise == linear else 1), (fqn, weight.placements)
        assert weight.grad is not None
    # fully_shard splits dim 0 on dp (strided where tp splits dim 0 too)
    assert all(getattr(p.placements[0], "dim", None) == 0 for p in model.parameters())
