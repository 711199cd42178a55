"""A small Llama planned with pipeline stages: pp 2 on a given mesh, and the mesh chosen for 8
devices. Built on the meta device; the plans are checked by their schema and by covering every
parameter with exactly one stage."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autoplan.errors import OptionError
from autoplan.pipeline_parallel.planner import suggest_devices, suggest_pipelined
from autoplan.plan.module_plan import Plan

LAYERS = 6


def _llama(tie: bool = False):
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _batch():
    return {"input_ids": torch.randint(0, 256, (16, 32)), "labels": torch.randint(0, 256, (16, 32))}


@pytest.fixture(scope="module")
def planned():
    model = _llama()
    plan, report = suggest_pipelined(model, _batch(), (2, 2, 2), ("pp", "dp", "tp"), "h100-sxm", memory_gib=0.02)
    return model, plan, report


def test_the_plan_validates_and_its_stages_cover_every_parameter(planned):
    model, plan, _ = planned
    again = Plan.from_dict(plan.to_dict())  # the schema and the checks a schema cannot make
    assert again.to_json() == plan.to_json()
    pipeline = plan.pipeline
    assert pipeline is not None and pipeline.size == 2 and pipeline.axis == "pp" and pipeline.axis_index == 0
    assert pipeline.full_mesh(plan.mesh_shape, plan.axis_names) == ((2, 2, 2), ("pp", "dp", "tp"))
    for fqn, _ in model.named_parameters():
        holders = [i for i, s in enumerate(pipeline.stages) if any(fqn == m or fqn.startswith(m + ".") for m in s.modules)]
        assert len(holders) == 1, fqn
    assert "model.embed_tokens" in pipeline.stages[0].modules
    assert "lm_head" in pipeline.stages[-1].modules and "model.norm" in pipeline.stages[-1].modules
    blocks = [m for s in pipeline.stages for m in s.modules if m.startswith("model.layers.")]
    assert blocks == [f"model.layers.{i}" for i in range(LAYERS)]  # contiguous, in model order


def test_the_prediction_is_the_pipelines(planned):
    _, plan, report = planned
    pipeline = plan.pipeline
    assert 16 % pipeline.microbatches == 0 and pipeline.microbatches >= pipeline.size
    assert {batch.shape[0] for batch in plan.inputs.values()} == {16}  # the whole batch's shape
    assert plan.predicted.peak_memory_bytes == max(s.peak_memory_bytes for s in pipeline.stages)
    assert plan.predicted.peak_memory_bytes <= 0.02 * 2**30  # it fits the budget it was given
    busiest = max(sum(s.forward_s + s.backward_s for s in pipeline.stages if s.rank == r) for r in range(2))
    assert plan.predicted.step_time_s >= pipeline.microbatches * busiest * (1 - 1e-5)
    assert 0 < pipeline.bubble_share < 1
    assert report.chosen.best is not None and report.chosen.best.fits


@pytest.mark.slow
def test_the_mesh_shape_is_chosen_among_every_factorisation():
    model = _llama()
    plan, report = suggest_devices(model, _batch(), 8, devices_per_node=4, profile="h100-sxm")
    shapes = {r.full_mesh for r in report.meshes}
    assert shapes == {(pp, dp, tp) for tp in (1, 2, 4) for pp in (1, 2, 4, 8) for dp in (8 // (pp * tp),)
                      if pp * tp <= 8 and 8 % (pp * tp) == 0 and pp <= LAYERS}
    chosen = report.chosen
    assert chosen.best is not None and chosen.best.fits
    assert all(r.best is None or r.best.step_s >= chosen.best.step_s or not r.best.fits for r in report.meshes)
    Plan.from_dict(plan.to_dict())
    if plan.pipeline is not None:
        assert len(plan.pipeline.alternatives) >= len(report.meshes) - 1


def test_tied_weights_across_stages_are_one_clear_error():
    with pytest.raises(OptionError, match="tied weights"):
        suggest_pipelined(_llama(tie=True), _batch(), (2, 2), ("pp", "dp"), "h100-sxm")


def test_a_mesh_without_a_pp_axis_is_one_clear_error():
    with pytest.raises(OptionError, match="no mesh axis is named 'pp'"):
        suggest_pipelined(_llama(), _batch(), (2, 2), ("dp", "tp"), "h100-sxm")


def test_the_parts_add_up_to_the_solvers_price():
    """The split into before-stack / blocks / after-stack loses nothing: one stage, one
    microbatch, no checkpointing is the ILP's own objective."""
    from dataclasses import replace

    from autoplan.pipeline.pinning import Pins
    from autoplan.pipeline.problem import prepare_problem, solve_problem
    from autoplan.pipeline_parallel.parts import layout_parts

    problem = replace(prepare_problem(_llama(), _batch(), (2, 2), ("dp", "tp"), "h100-sxm"), step=None)
    _, solution, _ = solve_problem(problem, Pins(problem), recompute=False)
    parts = layout_parts(problem, solution, 16)
    total = 0.0
    for part, times in ((parts.pre, 1), (parts.block, parts.blocks), (parts.post, 1)):
        total += times * (part.forward_per_token + part.backward_per_token + part.forward_per_microbatch
                          + part.backward_per_microbatch + part.per_step)
    assert total == pytest.approx(solution.objective_s, rel=1e-9)
    assert parts.pre.state_bytes > 0 and parts.post.state_bytes > 0  # the embedding; the norm and head
    assert parts.boundary_bytes > 0


def test_score_of_a_pipelined_plan_is_its_own_prediction(planned):
    """``autoplan score`` re-solves the plan's pinned layout as a stage and prices its own
    schedule, microbatches, split and checkpointing: what suggest predicted, stage by stage."""
    from autoplan.evaluate.score import score

    model, plan, _ = planned
    scored = score(model, _batch(), plan, memory_gib=0.02)
    assert scored.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-6)
    assert scored.peak_memory_bytes == plan.predicted.peak_memory_bytes and scored.fits
    assert scored.plan.pipeline.stages == plan.pipeline.stages
    with pytest.raises(OptionError, match="runs its pipeline with"):
        score(model, _batch(), plan, microbatches=plan.pipeline.microbatches * 2)


def test_gradient_accumulation_is_scored_as_one_stage(planned):
    """A layout run as k microbatches: each pays its per-microbatch costs again, and holds a
    k-th of the activations; at k = 1 it is the one-stage price of the whole batch."""
    from autoplan.evaluate.score import score

    model, _, report = planned
    layout = report.chosen.layout  # the stage mesh's plan, without stages
    assert layout.pipeline is None
    scores = [score(model, _batch(), layout, memory_gib=1.0, microbatches=k) for k in (1, 2, 4)]
    steps = [s.step_time_s for s in scores]
    peaks = [s.peak_memory_bytes for s in scores]
    assert steps[0] < steps[1] < steps[2]
    assert peaks[0] > peaks[1] > peaks[2]
    assert all(s.plan.pipeline is None for s in scores)
    with pytest.raises(OptionError, match="do not split into 32 microbatches"):
        score(model, _batch(), layout, microbatches=32)
