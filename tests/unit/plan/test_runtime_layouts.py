"""Layouts DTensor makes at run time that the planner's own rules did not say, and what the
apply engine hands a module's code: a norm over a split dim (left partial until read), a
redistribute whose path depends on the element size, an embedding's backward on the token
ids as autograd saved them, and a tied parameter read under its other name."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from autoplan.apply.parameters import gather_parameters_for_use
from autoplan.choices.graph import build_choices, planning_mesh
from autoplan.cost.comm import gradient_collectives, redistribute_collectives
from autoplan.dtensor import overrides
from autoplan.placements import runtime_placements, runtime_spec
from autoplan.plan.runtime_backward import embedding_backward
from autoplan.plan.runtime_choice import runtime_strategy
from autoplan.trace.tracer import trace_model

MESH = (2, 4)


def _decision(module, inputs, target):
    choices = build_choices(trace_model(module, inputs, loss_fn=lambda out, batch: out.sum()), MESH, ("dp", "tp"))
    return next(d for d in choices.graph.decisions() if d.fx_node.target == target)


class Normalized(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return F.normalize(self.proj(x), dim=-1)


def test_a_norm_over_a_split_dim_stays_partial_until_read():
    norm = _decision(Normalized(), (torch.randn(8, 16),), torch.ops.aten.linalg_vector_norm.default)
    with overrides.installed():
        ran = runtime_strategy(norm, [("R", "S(1)")], planning_mesh(MESH, ("dp", "tp")))
    assert ran.outputs == (("R", "P(2-norm)"),)  # each rank holds the norm of its share
    assert runtime_placements(ran.outputs[0])[1].norm_type == 2
    assert runtime_spec(runtime_placements(("R", "P(2-norm)"))) == ("R", "P(2-norm)")
    # the op that reads it whole all-reduces it, as a partial sum
    assert [m[:2] for m in redistribute_collectives(("R", "P(2-norm)"), ("R", "R"), 32, MESH, False)] == [("all_reduce", 1)]


def test_the_way_back_to_a_weight_stored_split_twice_depends_on_the_element_size():
    """DTensor prices its redistribute paths in bytes: a gradient partial on tp going back
    to a conv weight stored split by one dim over dp and tp (SwiftFormer's)."""
    shape, stored = (220, 112, 3, 3), ("_S(1, 4)", "S(1)")
    elements = 220 * 112 * 9
    bf16 = gradient_collectives(("R", "P(sum)"), stored, 2 * elements, MESH, shape)
    f32 = gradient_collectives(("R", "P(sum)"), stored, 4 * elements, MESH, shape)
    assert bf16 == [("reduce_scatter", 1, 2 * elements)]  # whole, then the dp split is a slice
    assert [kind for kind, _, _ in f32] == ["reduce_scatter", "all_to_all"]  # half, then the dp split swapped


class TokenEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)

    def forward(self, ids):
        return self.embed(ids)


def test_an_embedding_backward_runs_on_the_ids_as_saved():
    """The ids came split by batch on tp and DTensor gathered them inside the forward (below
    autograd): the backward slices the whole gradient to the ids as saved and hands the
    weight a gradient partial on tp."""
    embedding = _decision(TokenEmbedding(), (torch.randint(0, 64, (8, 16)),), torch.ops.aten.embedding.default)
    operands = {0: (("R", "R"), ("R", "R")), 1: (("R", "S(0)"), ("R", "R"))}
    with overrides.installed():
        layout, moves = embedding_backward(embedding, 0, ("R", "R"), operands, planning_mesh(MESH, ("dp", "tp")))
    assert layout == ("R", "P(sum)")
    assert moves == [("gradient", ("R", "R"), ("R", "S(0)")), (1, ("R", "S(0)"), ("R", "S(0)"))]
    moved_in_forward_too = {0: operands[0], 1: (("R", "R"), ("R", "R"))}
    assert embedding_backward(embedding, 0, ("R", "R"), moved_in_forward_too, planning_mesh(MESH, ("dp", "tp"))) is None


class Head(nn.Module):
    """MobileBERT's head: its decoder's bias is its own ``bias``, and it adds the decoder's."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.Linear(8, 16)
        self.bias = nn.Parameter(torch.zeros(16))
        self.decoder.bias = self.bias
        self.seen = None

    def forward(self, x):
        self.seen = self.decoder.bias.placements
        return x + self.decoder.bias


def test_a_tied_parameter_is_swapped_under_every_name(fake_mesh_2x4):
    head = Head()
    stored = nn.Parameter(distribute_tensor(head.bias.detach(), fake_mesh_2x4, [Shard(0), Shard(0)]))
    head.bias = stored
    head.decoder.bias = stored
    plan = SimpleNamespace(parameter_uses={"bias": ("R", "R")}, parameter_readers={}, opaque_modules={})
    gather_parameters_for_use({"": head, "decoder": head.decoder}, plan, fake_mesh_2x4)
    head(distribute_tensor(torch.zeros(4, 16), fake_mesh_2x4, [Replicate(), Replicate()]))
    assert head.seen == (Replicate(), Replicate())  # the plan's use layout, under the name the code reads
    assert head.bias is stored and head.decoder.bias is stored  # put back under both names
