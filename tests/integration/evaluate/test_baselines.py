"""Baseline plans on the tiny Llama (examples/llama.py), mesh 2x4 (dp, tp).

Each baseline has the layout it claims, is an ordinary plan that scores to its own
prediction, and autoplan's own plan predicts no slower than any of them: a baseline is
a pinned subset of what the planner searches.
"""

import pytest
from conftest import EXAMPLES, ROOT
from zoo import verify_on_fake_world

import autoplan
from autoplan.errors import NotApplicableError
from autoplan.evaluate.baselines import BASELINES, baseline_for_problem, build_baseline
from autoplan.evaluate.score import score_problem
from autoplan.model_file import import_model_file, load_model_file
from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import prepare_problem, solve_problem
from autoplan.verify.numerics import build_seeded, seeded_batch

MODELS = ROOT / "tests" / "models"
BATCH = ("[1]['input_ids']", "[1]['labels']")
LAYER = "model.layers.0"


@pytest.fixture(scope="module")
def built():
    loaded = load_model_file(str(EXAMPLES / "llama.py"))
    problem = prepare_problem(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo")
    auto, _, _ = solve_problem(problem, Pins(problem))
    return problem, auto, {name: baseline_for_problem(name, problem) for name in BASELINES}


def test_data_parallel_replicates_parameters_and_keeps_tp_idle(built):
    _, _, baselines = built
    plan = baselines["data_parallel"].plan
    assert set(plan.parameters.values()) == {("R", "R")}
    assert all(plan.inputs[key].placements == ("S(0)", "R") for key in BATCH)
    split_on_tp = {
        (fqn, key) for fqn, layout in plan.modules.items()
        for key, spec in [*layout.inputs.items(), *layout.outputs.items()] if spec[1] != "R"
    }
    assert len(plan.modules) > 20
    # The batch stays split on dp through the model (it is not gathered to save the gradient all-reduces).
    assert plan.modules["model.layers.0"].inputs["[0][0]"] == ("S(0)", "R")
    assert plan.modules["lm_head"].inputs["[0][0]"] == ("S(0)", "R")
    # Followers keep the layout they are handed (simplify.py), so nothing is split on tp,
    # the rotary cos/sin included.
    assert not split_on_tp, split_on_tp
    assert not any("still split on tp" in note for note in baselines["data_parallel"].notes)


def test_fsdp_shards_parameters_on_dp(built):
    _, _, baselines = built
    plan = baselines["fsdp"].plan
    assert plan.parameters[f"{LAYER}.self_attn.q_proj.weight"] == ("S(0)", "R")
    assert plan.parameters[f"{LAYER}.input_layernorm.weight"] == ("S(0)", "R")
    assert plan.parameters["model.embed_tokens.weight"] == ("S(0)", "R")
    assert all(spec[1] == "R" for spec in plan.parameters.values())
    assert all(plan.inputs[key].placements == ("S(0)", "R") for key in BATCH)


def test_megatron_is_torchtitans_layout(built):
    _, _, baselines = built
    params = baselines["megatron"].plan.parameters
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert params[f"{LAYER}.{name}.weight"] == ("R", "S(0)"), name
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        assert params[f"{LAYER}.{name}.weight"] == ("R", "S(1)"), name
    for fqn in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", f"{LAYER}.input_layernorm.weight"):
        assert params[fqn] == ("R", "R"), fqn
    assert all(baselines["megatron"].plan.inputs[key].placements == ("S(0)", "R") for key in BATCH)


def test_megatron_fsdp_combines_both(built):
    _, _, baselines = built
    params = baselines["megatron_fsdp"].plan.parameters
    assert params[f"{LAYER}.self_attn.q_proj.weight"] == ("S(1)", "S(0)")  # dim 0 is taken by tp
    assert params[f"{LAYER}.mlp.down_proj.weight"] == ("S(0)", "S(1)")
    assert params["model.embed_tokens.weight"] == ("S(0)", "R")
    assert params[f"{LAYER}.post_attention_layernorm.weight"] == ("S(0)", "R")


def test_torchtitan_is_sequence_parallel_over_fsdp(built):
    _, _, baselines = built
    baseline = baselines["torchtitan"]
    params, modules = baseline.plan.parameters, baseline.plan.modules
    # FSDP2 over tensor parallel: dim 0 on dp, under tp's split of dim 0 (DTensor's _StridedShard).
    assert params[f"{LAYER}.self_attn.q_proj.weight"] == ("_S(0, 4)", "S(0)")
    assert params[f"{LAYER}.mlp.down_proj.weight"] == ("S(0)", "S(1)")
    assert params[f"{LAYER}.input_layernorm.weight"] == ("S(0)", "R")
    assert params["lm_head.weight"] == ("_S(0, 4)", "S(0)")  # split by vocabulary on tp
    assert params["model.embed_tokens.weight"] == ("S(0)", "R")  # its masked partial lookup is not expressible
    # Norms run on sequence slices; the embedding and each block hand sequence slices on.
    for norm in (f"{LAYER}.input_layernorm", f"{LAYER}.post_attention_layernorm", "model.norm"):
        assert modules[norm].inputs["[0][0]"] == ("S(0)", "S(1)"), norm
        assert modules[norm].outputs[""] == ("S(0)", "S(1)"), norm
    assert modules["model.embed_tokens"].outputs[""] == ("S(0)", "S(1)")
    assert modules[LAYER].outputs[""] == ("S(0)", "S(1)")
    assert baseline.notes == ("model.embed_tokens: not split by vocabulary on tp (its masked partial output is not expressible)",)


def test_torchtitan_splits_a_fused_wqkv_and_runs_its_prediction():
    loaded = load_model_file(str(MODELS / "fused_qkv.py"))
    plan = build_baseline("torchtitan", loaded.model, loaded.example_inputs, profile="cpu-gloo").plan
    assert plan.parameters["layers.0.attention.wqkv.weight"] == ("_S(0, 4)", "S(0)")
    assert plan.parameters["output.weight"] == ("_S(0, 4)", "S(0)")
    model_file = import_model_file(MODELS / "fused_qkv.py")
    result = verify_on_fake_world(build_seeded(model_file, "build_model", 0), seeded_batch(model_file, 1), plan)
    assert result.passed, "\n" + result.summary()


def test_auto_plan_predicts_no_slower_than_any_baseline(built):
    problem, auto, baselines = built
    for name, baseline in baselines.items():
        assert baseline.fits, name
        assert auto.predicted.step_time_s <= baseline.plan.predicted.step_time_s, name
        # A baseline is a plan like any other: scoring it gives its own prediction back.
        assert score_problem(problem, baseline.plan).step_time_s == baseline.plan.predicted.step_time_s, name


def test_gpt2_conv1d_weights_are_sharded_on_their_transposed_dims():
    loaded = load_model_file(str(EXAMPLES / "gpt2.py"))
    params = build_baseline("megatron", loaded.model, loaded.example_inputs, profile="cpu-gloo").plan.parameters
    assert params["transformer.h.0.attn.c_attn.weight"] == ("R", "S(1)")  # Conv1D: input x output
    assert params["transformer.h.0.attn.c_attn.bias"] == ("R", "S(0)")
    assert params["transformer.h.0.mlp.c_proj.weight"] == ("R", "S(0)")
    assert params["transformer.h.0.mlp.c_proj.bias"] == ("R", "R")


def test_baselines_that_do_not_apply_say_so():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    with pytest.raises(NotApplicableError, match="no transformer projections found"):
        build_baseline("megatron", loaded.model, loaded.example_inputs, mesh=(2, 4))
    with pytest.raises(NotApplicableError, match="needs a 2-D mesh"):
        build_baseline("megatron_fsdp", loaded.model, loaded.example_inputs, mesh=(8,), axis_names=("dp",))
    with pytest.raises(NotApplicableError, match="unknown baseline"):
        build_baseline("zero3", loaded.model, loaded.example_inputs)
    plan = build_baseline("fsdp", loaded.model, loaded.example_inputs, mesh=(8,), axis_names=("dp",)).plan
    assert plan.parameters["0.weight"] == ("S(0)",) and plan.inputs["[0][0]"].placements == ("S(0)",)
    assert isinstance(plan, autoplan.Plan)
