"""Rotary embeddings computed in complex numbers (Meta's reference Llama, torchtitan's Llama 3):
the complex values carry the gradient from q and k back to their projections, so the
planner follows it through them (torchtitan's forced Llama 3 plan gathered on dp in its
rotary embedding's backward where nothing was predicted: complex values counted as
carrying no gradient)."""

import torch
from conftest import ROOT

from autoplan.choices.graph import build_choices
from autoplan.model_file import import_model_file
from autoplan.trace.tracer import trace_model

MODEL = ROOT / "tests" / "models" / "complex_rope.py"


def test_complex_rotary_values_carry_the_gradient():
    module = import_model_file(MODEL)
    model, batch = module.build_model(), module.example_inputs()
    traced = trace_model(model, batch, module.compute_loss)
    choices = build_choices(traced, (2, 4), ("dp", "tp"))
    complex_ops = [d for d in choices.graph.decisions()
                   if isinstance(d.fx_node.meta.get("val"), torch.Tensor) and d.fx_node.meta["val"].is_complex()
                   and d.fx_node.target is not torch.ops.aten.view.default]
    rotated = [d for d in complex_ops if d.fx_node.target == torch.ops.aten.mul.Tensor]
    assert len(rotated) == 2 * module.LAYERS  # q and k of every layer
    assert all(d.requires_grad for d in rotated)
    assert all(d.requires_grad for d in complex_ops if d.fx_node.target == torch.ops.aten.view_as_complex.default)
