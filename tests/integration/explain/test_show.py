"""``autoplan show``: a real plan (the 7B-shaped Llama on 2x4, and baselines of the tiny
Llama) in words, with time and memory that add up to the plan's own prediction."""

import dataclasses
import io
import json

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.evaluate.baselines import baseline_for_problem
from autoplan.explain.patterns import COLUMN, DATA_PARALLEL, FSDP, REPLICATED, ROW, module_rows
from autoplan.explain.render import render
from autoplan.explain.show import ms, show_sections, summarize
from autoplan.model_file import load_model_file
from autoplan.pipeline.problem import prepare_problem
from autoplan.placements import shard_dim


@pytest.fixture(scope="module")
def llama7b(tmp_path_factory):
    loaded = load_model_file(str(EXAMPLES / "llama_7b.py"))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), broadcast=False)
    path = tmp_path_factory.mktemp("show") / "llama7b.json"
    plan.save(path)
    return plan, path


@pytest.fixture(scope="module")
def tiny_baselines():
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    problem = prepare_problem(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo")
    return {name: baseline_for_problem(name, problem).plan for name in ("megatron", "fsdp", "data_parallel")}


def test_show_folds_layers_and_names_each_axis_from_the_placements(llama7b, capsys):
    plan, path = llama7b
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model.layers.0-1.self_attn.q_proj" in out and "model.layers.1.self_attn" not in out
    rows = {r.name: r for r in module_rows(plan)}
    q = rows["model.layers.0-1.self_attn.q_proj"]
    assert q.count == 2
    stored = plan.parameters["model.layers.0.self_attn.q_proj.weight"]
    used = plan.parameter_uses.get("model.layers.0.self_attn.q_proj.weight", stored)
    for axis, (s, u) in enumerate(zip(stored, used)):
        expected = FSDP if shard_dim(s) is not None and shard_dim(u) is None else {0: COLUMN, 1: ROW}.get(shard_dim(u))
        if expected is not None:
            assert q.words[axis] == expected, (axis, s, u, q.words)
    o = rows["model.layers.0-1.self_attn.o_proj"]
    o_used = plan.parameter_uses.get("model.layers.0.self_attn.o_proj.weight", plan.parameters["model.layers.0.self_attn.o_proj.weight"])
    assert [w == ROW for w in o.words] == [shard_dim(p) == 1 for p in o_used]
    # the placements stand beside the words
    assert "[S(0), S(1)]" in out or "[R, S(0)]" in out


def test_show_json_adds_up_to_the_prediction(llama7b, capsys):
    plan, path = llama7b
    assert main(["show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    p = plan.predicted
    m = data["memory"]
    # the cost stage's split of the peak, where the backward starts: no gradients yet
    assert m["gradients"] == 0 and m["optimizer"] == 2 * m["parameters"] > 0
    assert m["element_bytes"] == 2  # bf16, as the model file builds it
    assert m["parameters"] + m["gradients"] + m["optimizer"] + m["activations"] + m["temporaries"] == p.peak_memory_bytes
    comm = sum(r["seconds"] for r in data["comm"]) + data["comm_other_s"]
    assert data["compute_s"] + comm == pytest.approx(p.step_time_s, rel=1e-6)
    table = {(r["axis"], r["kind"]): (r["count"], r["bytes"]) for r in data["comm"]}
    expected = {(a, k): (e["count"], e["bytes"]) for a, kinds in p.collectives.items() for k, e in kinds.items()}
    assert table == expected
    assert 0 < data["mfu"] < 1


def _expected_word(plan, fqn, axis):
    """The rule of patterns.py, from the plan's own stored and used placements."""
    stored = plan.parameters[fqn][axis]
    used = plan.parameter_uses.get(fqn, plan.parameters[fqn])[axis]
    if shard_dim(stored) is not None and shard_dim(used) is None:
        return FSDP
    return {0: COLUMN, 1: ROW}.get(shard_dim(used))


def test_words_for_the_layouts_people_write(tiny_baselines):
    plan = tiny_baselines["megatron"]
    mega = {r.name: r for r in module_rows(plan)}
    assert mega["model.layers.0-1.mlp.up_proj"].words == (DATA_PARALLEL, COLUMN)
    assert mega["model.layers.0-1.mlp.down_proj"].words == (DATA_PARALLEL, ROW)
    dp = {r.name: r for r in module_rows(tiny_baselines["data_parallel"])}
    assert all(r.words == (DATA_PARALLEL, REPLICATED) for r in dp.values() if r.kind == "Linear"), dp
    # Whatever a baseline pins, the words say what its cheapest execution runs: on this
    # tiny model the megatron layout gathers its attention weights before use (FSDP-style
    # on tp), and the fsdp layout computes with its dim-0 shards (column-parallel on dp).
    for name, plan in tiny_baselines.items():
        rows = {r.name: r for r in module_rows(plan)}
        for fqn, _kind in ((f"model.layers.0.{m}.weight", "Linear") for m in ("self_attn.q_proj",
            "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")):
            row = rows[fqn.replace("layers.0", "layers.0-1").rpartition(".")[0]]
            for axis in range(2):
                expected = _expected_word(plan, fqn, axis)
                if expected is not None:
                    assert row.words[axis] == expected, (name, fqn, axis, row)


def test_a_plan_that_replicates_everything_says_the_mesh_gains_nothing(tmp_path, capsys):
    loaded = load_model_file(str(EXAMPLES / "moe.py"))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), broadcast=False)
    summary = summarize(plan)
    assert summary.all_replicated
    assert all(set(r.words) == {REPLICATED} for r in summary.rows)
    text = io.StringIO()
    render(show_sections(summary), text)
    assert "speed-up over one device is 1.0x" in text.getvalue() and "Why:" in text.getvalue()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_rich_table_and_a_pipe_plain_text(llama7b):
    summary = summarize(llama7b[0])
    terminal, pipe = _Terminal(), io.StringIO()
    render(show_sections(summary), terminal)
    render(show_sections(summary), pipe)
    assert "┃" in terminal.getvalue() or "│" in terminal.getvalue()
    assert "│" not in pipe.getvalue() and "\x1b[" not in pipe.getvalue()
    assert "[S(0), S(1)]" in terminal.getvalue()  # placements survive rich's markup


def test_show_of_a_missing_plan_is_one_line_error(tmp_path, capsys):
    assert main(["show", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fix:" in err[0]


def test_suggest_ends_with_the_folded_summary_and_verbose_keeps_every_parameter(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["suggest", str(EXAMPLES / "llama.py"), "--mesh", "2x4", "--memory-gib", "0.001", "--out", str(out)]
    assert main(argv) == 0
    brief = capsys.readouterr().out
    plan = autoplan.Plan.load(out)
    # the two layers' modules planned alike fold into one row; which they are is the plan's
    # (torch 2.13 plans every projection of the two layers alike, 2.14 not the query's)
    folded = [line.split()[0] for line in brief.splitlines() if line.strip().startswith("model.layers.0-1.")]
    assert folded, brief
    for row in folded:
        module = row.removeprefix("model.layers.0-1.")
        for name in ("weight", "bias"):
            if f"model.layers.0.{module}.{name}" in plan.parameters:
                assert plan.parameters[f"model.layers.0.{module}.{name}"] == plan.parameters[f"model.layers.1.{module}.{name}"]
    if plan.parameters["model.layers.0.self_attn.q_proj.weight"] == plan.parameters["model.layers.1.self_attn.q_proj.weight"]:
        assert "model.layers.0-1.self_attn.q_proj" in brief
    assert not [fqn for fqn in plan.parameters if fqn in brief], "the brief names modules, not parameters"
    assert brief.splitlines()[-1] == f"plan written to {out}"
    assert main([*argv, "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert all(fqn in verbose for fqn in plan.parameters)
    assert all(row in verbose for row in folded)


def test_words_for_experts_routers_and_norm_scales():
    from autoplan.explain.patterns import EXPERT, FEATURES, axis_word

    experts = "model.layers.0.mlp.experts.gate_up_proj"  # Mixtral: (expert, out, in)
    assert axis_word("MixtralExperts", experts, (8, 28672, 4096), "S(0)", "S(0)", None) == EXPERT
    assert axis_word("MixtralExperts", experts, (8, 28672, 4096), "S(1)", "S(1)", None) == f"{COLUMN} (each expert)"
    assert axis_word("MixtralExperts", experts, (8, 28672, 4096), "S(2)", "S(2)", None) == f"{ROW} (each expert)"
    assert axis_word("MixtralExperts", experts, (8, 28672, 4096), "S(0)", "R", "S(0)") == FSDP
    assert axis_word("MixtralTopKRouter", "model.layers.0.mlp.gate.weight", (8, 4096), "S(1)", "S(1)", None) == ROW
    assert axis_word("LlamaRMSNorm", "model.norm.weight", (4096,), "S(0)", "S(0)", "S(2)") == FEATURES
    assert axis_word("LlamaRMSNorm", "model.norm.weight", (4096,), "R", "R", "S(1)") == "sequence-parallel"


def test_a_table_above_the_cost_stages_charge_is_shown_with_where_its_time_is(llama7b):
    # a plan whose collective table comes to more than the communication the cost stage
    # charged (the MoE's experts on 2x4 at its real widths: 59.7 ms against 21.3 ms): the
    # gap is a negative "other" row, and the note gives both figures and the modules
    # holding the table's time
    plan = llama7b[0]
    p = plan.predicted
    table = summarize(plan).comm_s - summarize(plan).comm_other_s
    charged = table / 3
    lower = dataclasses.replace(p, comm_s=charged, step_time_s=p.compute_s + charged)
    summary = summarize(dataclasses.replace(plan, predicted=lower))
    assert summary.comm_other_s == pytest.approx(charged - table)
    assert sum(seconds for _, seconds in summary.comm_by_module) == pytest.approx(table)
    text = io.StringIO()
    render(show_sections(summary), text)
    note = " ".join(text.getvalue().split())
    top, top_s = summary.comm_by_module[0]
    assert f"comes to {ms(table)} ms, {ms(table - charged)} ms (200%) more than the {ms(charged)} ms" in note
    assert f"the step would take {ms(lower.step_time_s + table - charged)} ms" in note
    assert f"mostly in {top} ({ms(top_s)} ms)" in note
    assert ".0-1." in top or top in plan.predicted.module_collectives  # repeated layers folded


def test_show_and_diff_name_the_recomputed_blocks_folded(llama7b, tmp_path, capsys):
    plan = llama7b[0]
    recompute = {"model.layers.0": "full", "model.layers.1": "full", "lm_head": "selective"}
    assert all(any(fqn.startswith(m + ".") for fqn in plan.parameters) for m in recompute)
    checkpointed = dataclasses.replace(plan, recompute=recompute)
    summary = summarize(checkpointed)
    assert summary.recompute == (("lm_head", "selective"), ("model.layers.0-1", "full"))
    text = io.StringIO()
    render(show_sections(summary), text)
    assert "activation checkpointing" in text.getvalue() and "model.layers.0-1" in text.getvalue()
    assert summarize(plan).recompute == ()

    a, b = plan.save(tmp_path / "a.json"), checkpointed.save(tmp_path / "b.json")
    assert main(["diff", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recompute"] == [["lm_head", "-", "selective"], ["model.layers.0-1", "-", "full"]]


def test_show_judges_the_peak_against_the_budget_the_plan_was_solved_under():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), memory_gib=123.0, cache=False, broadcast=False)
    assert plan.solver.memory_budget_bytes == 123.0 * 2**30
    assert autoplan.Plan.from_dict(json.loads(plan.to_json())).solver == plan.solver
    memory = summarize(plan).memory
    assert (memory.budget, memory.budget_source) == (123.0 * 2**30, "the budget it was planned under")
    older = dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, memory_budget_bytes=None))
    assert summarize(older).memory.budget_source.startswith("the profile's device memory")
