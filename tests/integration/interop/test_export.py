"""``autoplan export``: the veScale dict holds the plan's layouts, the torch export maps
Megatron-shaped parameters to ParallelStyles and lists the rest, and the generated module
runs (tp styles + fully_shard) on a 2x4 fake process group."""

import json
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from conftest import EXAMPLES
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.cli import main
from autoplan.evaluate.baselines import build_baseline
from autoplan.interop.export_layout import exported_plan, score_export
from autoplan.interop.export_render import difference_lines
from autoplan.interop.export_table import export_rows
from autoplan.interop.export_torch import export_torch
from autoplan.interop.export_vescale import export_vescale
from autoplan.model_file import import_model_file, load_model_file
from autoplan.placements import spec_from_placements
from autoplan.plan.module_plan import ModuleLayout, Plan, Predicted, SolverReport
from autoplan.verify.numerics import build_seeded, seeded_batch


def hand_plan(**changes) -> Plan:
    """A 1-D tp plan of an MLP block: fc1 column-split, fc2 row-split, the hidden split between."""
    base = dict(
        mesh_shape=(4,), axis_names=("tp",),
        parameters={"mlp.fc1.weight": ("S(0)",), "mlp.fc1.bias": ("S(0)",), "mlp.fc2.weight": ("S(1)",),
            "mlp.fc2.bias": ("R",), "norm.weight": ("R",)},
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
        parameters={"mlp.fc1.weight": ("S(0)",), "mlp.fc1.bias": ("R",), "mlp.fc2.weight": ("S(1)",),
            "mlp.fc2.bias": ("R",), "norm.weight": ("S(0)",)},
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
    model = _stepped_export(export, tmp_path)
    for fqn, style in export.styles.items():
        weight = model.get_submodule(fqn).weight
        colwise, linear = style.startswith("Colwise"), plan.module_types[fqn] == "Linear"
        assert weight.placements[1].is_shard(0 if colwise == linear else 1), (fqn, weight.placements)
        assert weight.grad is not None
    # every parameter is held as the export says it writes it, and as the plan stores it
    # wherever the export lists no difference for its module (fully_shard on the plan's dim)
    written = exported_plan(plan, export).parameters
    held = {fqn: placements_by_axis(p, plan.axis_names) for fqn, p in model.named_parameters()}
    assert held == {fqn: written[fqn] for fqn in held}
    exact = {fqn for fqn in held if fqn.rpartition(".")[0] not in export.differences}
    assert exact and all(held[fqn] == plan.parameters[fqn] for fqn in exact)
    assert any(export.data_parallel.shard_dims.values())  # some weights the plan splits on dim 1 of dp


def placements_by_axis(param, axis_names) -> tuple[str, ...]:
    """A parameter's placement per mesh axis ("R" on an axis its DTensor's mesh does not span)."""
    on = dict(zip(param.device_mesh.mesh_dim_names, spec_from_placements(param.placements)))
    return tuple(on.get(axis, "R") for axis in axis_names)


def test_replicated_weights_use_replicate_and_match_the_plan_exactly(tmp_path, fake_world):
    """Megatron on tp, weights whole on dp: replicate (not fully_shard), and every parameter
    held exactly as the plan stores it; the header and the scores say "exactly the plan"."""
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan = build_baseline("megatron", loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo").plan
    # the baseline stores the attention projections split on tp and gathers them for use
    # (two kv heads do not split four ways): written as used, the plan has nothing torch cannot say
    # and the rotary tables, computed from positions alone, whole on every dp rank as data parallel has them
    modules = {fqn: ModuleLayout({k: ("R", "R") if "position_embeddings" in k else s for k, s in m.inputs.items()},
                                 dict.fromkeys(m.outputs, ("R", "R")) if fqn.endswith("rotary_emb") else m.outputs)
               for fqn, m in plan.modules.items()}
    plan = replace(plan, parameters={f: plan.parameter_uses.get(f, s) for f, s in plan.parameters.items()},
                   parameter_uses={}, modules=modules)
    export = export_torch(plan)
    assert export.differences == {} and "Exactly the plan." in export.source
    assert export.fsdp_modules == () and export.data_parallel.replicate == ("",)
    scored, layout = score_export(loaded.model, loaded.example_inputs, plan, export, loss_fn=loaded.loss_fn)
    assert layout.parameters == plan.parameters
    assert scored.exact and scored.summary().startswith("exported layout: exactly the plan")
    assert scored.exported.step_time_s == pytest.approx(scored.plan.step_time_s, rel=1e-9)

    model = _stepped_export(export, tmp_path)
    held = {fqn: placements_by_axis(p, plan.axis_names) for fqn, p in model.named_parameters()}
    assert held == plan.parameters


def test_what_torch_cannot_say_is_listed_per_module_and_scored(capsys):
    """FSDP-style storage on tp (stored split, gathered for use) has no ParallelStyle: the
    export writes those weights replicated on tp, lists each module once per layer group,
    and scores the exported layout beside the plan with the real cost model."""
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan = build_baseline("megatron_fsdp", loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo").plan
    export = export_torch(plan)
    gathered = {fqn for fqn, use in plan.parameter_uses.items() if use[1] != plan.parameters[fqn][1]}
    assert gathered and set(export.differences) == {fqn.rpartition(".")[0] for fqn in gathered}
    scored, layout = score_export(loaded.model, loaded.example_inputs, plan, export, loss_fn=loaded.loss_fn)
    assert all(layout.parameters[fqn][1] == "R" for fqn in gathered)
    assert not scored.exact and scored.modules_differing >= len(export.differences)
    assert scored.exported.step_time_s != scored.plan.step_time_s  # two layouts, two real scores
    ms = lambda s: f"{s.step_time_s * 1e3:.1f} ms"  # noqa: E731
    summary = scored.summary()
    assert ms(scored.exported) in summary and ms(scored.plan) in summary and " %" in summary
    rows = {row[0]: row for row in export_rows(plan, export)}
    assert "model.layers.0-1.self_attn.q_proj" in rows and "exported R" in rows["model.layers.0-1.self_attn.q_proj"][3]
    assert "model.layers.0-1.mlp.gate_proj" in rows and rows["model.layers.0-1.mlp.gate_proj"][3] == ""


def test_a_tied_embedding_split_on_both_axes_keeps_one_tensor():
    """The 1B plan's shape: the embedding (tied to the head) stored S(1) on dp and S(0) on tp,
    looked up by hidden slices on dp; the layers whole on dp. Layers: replicate; the tied
    weight: one fully_shard group at the root on dim 1, one style per module on its storage."""
    rep = ModuleLayout({"[0][0]": ("S(0)", "R")}, {"": ("S(0)", "R")})
    plan = hand_plan(
        mesh_shape=(2, 4), axis_names=("dp", "tp"),
        parameters={"embed.weight": ("S(1)", "S(0)"), "head.weight": ("S(1)", "S(0)"),
                    "layers.0.fc.weight": ("R", "S(0)"), "layers.1.fc.weight": ("R", "S(0)"), "norm.weight": ("R", "R")},
        parameter_uses={"embed.weight": ("S(1)", "R"), "head.weight": ("R", "S(0)")},
        tied_parameters={"head.weight": "embed.weight"},
        modules={"embed": ModuleLayout({"[0][0]": ("R", "R")}, {"": ("S(2)", "R")}), "head": rep, "norm": rep,
                 "layers.0": rep, "layers.1": rep, "layers.0.fc": rep, "layers.1.fc": rep},
        module_types={"embed": "Embedding", "head": "Linear", "layers.0.fc": "Linear", "layers.1.fc": "Linear", "norm": "LayerNorm"},
    )
    export = export_torch(plan)
    assert export.styles["embed"].startswith("RowwiseParallel") and export.styles["head"].startswith("ColwiseParallel")
    dp = export.data_parallel
    assert dp.replicate == ("layers.0", "layers.1", "norm") and dp.fully_shard == ("",)
    assert dp.shard_dims == {"embed.weight": 1}
    assert exported_plan(plan, export).parameters["head.weight"] == ("S(1)", "S(0)")
    assert "'head.weight': 'embed.weight'" in export.source
    lines = "\n".join(difference_lines(export))
    assert "embed: weight: the plan gathers it to R on tp for use" in lines
    assert "the plan computes with S(1) on dp; fully_shard gathers it" in lines
    assert "fully_shard(" in export.source and "replicate(" in export.source
    compile(export.source, "generated.py", "exec")


def tied_llama():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config)


def test_a_tied_embedding_split_on_both_axes_runs_as_one_tensor(fake_world):
    """A tiny tied Llama laid out as the 1B plan is: the generated module keeps the head and
    the embedding one tensor, held (S(1) on dp, S(0) on tp) as the plan stores it, and a
    training step runs on the 2x4 fake process group."""
    model = tied_llama()
    batch = {"input_ids": torch.randint(0, 256, (8, 32)), "labels": torch.randint(0, 256, (8, 32))}
    plan = build_baseline("megatron", model, batch, (2, 4), ("dp", "tp"), "cpu-gloo").plan
    assert plan.tied_parameters == {"lm_head.weight": "model.embed_tokens.weight"}
    tied = ("S(1)", "S(0)")
    plan = replace(
        plan,
        parameters={**plan.parameters, "lm_head.weight": tied, "model.embed_tokens.weight": tied},
        parameter_uses={**plan.parameter_uses, "model.embed_tokens.weight": ("S(1)", "R"), "lm_head.weight": ("R", "S(0)")},
    )
    export = export_torch(plan)
    assert export.data_parallel.fully_shard == ("",) and export.data_parallel.shard_dims == {"model.embed_tokens.weight": 1}
    namespace: dict = {}
    exec(compile(export.source, "generated.py", "exec"), namespace)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    model = namespace["parallelize"](model, mesh)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model(**{k: v[:4] for k, v in batch.items()}).loss.backward()
    written = exported_plan(plan, export).parameters
    held = {fqn: placements_by_axis(p, plan.axis_names) for fqn, p in model.named_parameters()}
    assert held["model.embed_tokens.weight"] == tied == written["lm_head.weight"]
    assert held == {fqn: written[fqn] for fqn in held}
    assert model.model.embed_tokens.weight.grad is not None


def test_cli_with_the_model_scores_and_prints_one_row_per_module_group(tmp_path, capsys):
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    plan = build_baseline("megatron_fsdp", loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo").plan
    plan_path = plan.save(tmp_path / "llama-2x4.json")
    out_path = tmp_path / "exported.py"
    assert main(["export", str(plan_path), "--format", "torch", "--model", str(EXAMPLES / "llama.py"), "--out", str(out_path)]) == 0
    printed = capsys.readouterr().out
    [summary] = [line for line in printed.splitlines() if line.startswith("exported layout: ")]
    assert " ms, " in summary and "the plan: " in summary and " %" in summary and "differs in " in summary
    assert summary in out_path.read_text()  # the file's header says the same
    assert "model.layers.0-1.mlp.gate_proj" in printed
    assert max(line.count("model.layers.") for line in printed.splitlines()) <= 1  # no line of names
    assert "not expressed: model.layers.0-1.self_attn.q_proj.weight: stored S(0) on tp" in printed  # one line per group
    assert main(["export", str(plan_path), "--format", "torch", "--out", str(out_path)]) == 0
    assert "not scored: pass --model" in capsys.readouterr().out


def _stepped_export(export, tmp_path):
    """The generated module applied to the tiny Llama on a 2x4 mesh of the fake world, after
    one forward and backward on this dp rank's half of the batch."""
    path = tmp_path / "generated.py"
    path.write_text(export.source)
    generated = import_model_file(path)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    llama = import_model_file(EXAMPLES / "llama.py")
    model = generated.parallelize(build_seeded(llama, "build_model", 0), mesh)
    batch = {k: v[:4] for k, v in seeded_batch(llama, 1).items()}  # this dp rank's half
    model(**batch).loss.backward()
    return model
