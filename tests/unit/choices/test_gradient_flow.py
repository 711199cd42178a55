"""Which traced values carry a gradient (``choices/graph.py``) and which ops DTensor runs
pointwise (``dtensor/strategies.py``): the collectives a plan predicts for the backward
follow from both (``plan/collectives.py``)."""

import pytest
import torch
from torch import nn
from zoo import verify_on_fake_world

import autoplan
from autoplan.choices.graph import build_choices
from autoplan.dtensor.strategies import is_pointwise
from autoplan.errors import InfeasibleError
from autoplan.trace.tracer import trace_model

aten = torch.ops.aten


class DroppedProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.proj(x)).sum()


def test_a_dropout_mask_carries_no_gradient():
    # Dropout traces as empty_like(x).bernoulli_(p).div_(p) times x: the mask reads x for its
    # shape only, so no gradient goes back through it (a plan once gathered one that never ran).
    choices = build_choices(trace_model(DroppedProjection().train(), (torch.randn(4, 16),)), (2, 4), ("dp", "tp"))
    by_target = {}
    for decision in choices.graph.decisions():
        by_target.setdefault(decision.fx_node.target, []).append(decision)
    mask_ops = [aten.empty_like.default, aten.bernoulli_.float, aten.div_.Scalar]
    assert all(op in by_target for op in mask_ops), sorted(map(str, by_target))
    assert not any(d.requires_grad for op in mask_ops for d in by_target[op])
    assert all(d.requires_grad for d in by_target[aten.mul.Tensor])  # the projection times the mask


def test_ops_with_partial_rules_of_their_own_are_pointwise():
    # Newer torch registers neg, mul, add and div apart from its pointwise list; their
    # backward runs split all the same (a rotary embedding's negated half).
    for op in (aten.neg.default, aten.mul.Tensor, aten.add.Tensor, aten.div_.Scalar, aten.silu.default):
        assert is_pointwise(op), op
    for op in (aten.slice.Tensor, aten.cat.default, aten.mm.default, aten.sum.dim_IntList):
        assert not is_pointwise(op), op


class GatedNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, gate):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * x * nn.functional.silu(gate)


class Recurrence(nn.Module):
    """A linear recurrence that writes each step's state into a zero tensor, and a gated
    norm of what it wrote (Olmo-Hybrid's chunked delta rule and output norm, made small)."""

    def __init__(self, dim):
        super().__init__()
        self.value = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, dim, bias=False)
        self.norm = GatedNorm(dim)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        v = self.value(x)
        out = torch.zeros_like(v)
        state = torch.zeros_like(v[:, 0])
        for t in range(x.shape[1]):
            state = 0.5 * state + v[:, t]
            out[:, t] = state
        return self.out(self.norm(out, self.gate(x)))


class RecurrentLM(nn.Module):
    def __init__(self, vocab=512, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = Recurrence(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.mix(self.embed(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _recurrent_lm():
    torch.manual_seed(0)
    return RecurrentLM(), (torch.randint(0, 512, (8, 16)), torch.randint(0, 512, (8, 16)))


def test_reads_of_a_tensor_written_in_place_carry_a_gradient():
    # ``out[:, t] = state`` rebases ``out`` on the write: the norm's reads of it get a gradient.
    model, batch = _recurrent_lm()
    graph = build_choices(trace_model(model, batch), (2, 4), ("dp", "tp")).graph
    norm_ops = [d for d in graph.decisions() if d.module == "mix.norm"]
    assert norm_ops and all(d.requires_grad for d in norm_ops), [(d.name, d.requires_grad) for d in norm_ops]


@pytest.mark.slow  # plans twice
def test_a_norm_of_a_tensor_written_in_place_runs_its_predicted_backward():
    # The forcing budget splits the norm's input by hidden on tp; the gradient of its mean
    # over that dim is partial, and reduce-scattered where the norm's boundary moved it,
    # which the prediction left out while it took the reads of ``out`` for values without
    # a gradient.
    model, batch = _recurrent_lm()
    with pytest.raises(InfeasibleError) as refused:  # a budget no plan meets says what the leanest needs
        autoplan.suggest(model, batch, memory_gb=1e-9, cache=False)
    state = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    plan = autoplan.suggest(model, batch, memory_gib=(refused.value.smallest_bytes + state / 64) / 2**30, cache=False)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
