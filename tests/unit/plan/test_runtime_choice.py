"""An op whose backward makes an input's gradient last with a kernel DTensor runs on whole
tensors only hands that input a whole gradient (``plan/runtime_choice.replicated_gradient``).
``linalg_solve_triangular``'s backward masks the matrix's gradient with ``tril``, whose rule
replicates every input: the gradient, split by batch where the solve ran split, is gathered
there on every axis. Qwen3-Next's gated delta rule solves its chunk's triangular system so."""

import torch
from torch import nn
from zoo import verify_on_fake_world

from autoplan.pipeline.suggest import suggest_with_report


class TriangularSolve(nn.Module):
    """A unit lower triangular system made of the keys, solved for the values."""

    def __init__(self, width: int, chunk: int):
        super().__init__()
        self.keys = nn.Linear(width, width)
        self.values = nn.Linear(width, width)
        self.register_buffer("strictly_lower", torch.ones(chunk, chunk).tril(-1))

    def forward(self, x):
        keys = self.keys(x)
        system = (keys @ keys.transpose(-1, -2)) * self.strictly_lower
        solved = torch.linalg.solve_triangular(system, self.values(x), upper=False, unitriangular=True)
        return solved.square().mean()


def test_the_gradient_of_a_triangular_system_is_gathered_whole():
    torch.manual_seed(0)
    # (batch, heads, chunk, width), large enough that the plan keeps the batch split on dp
    model, batch = TriangularSolve(64, 16), (torch.randn(8, 32, 16, 64),)
    pinned = {"[0][0]": ("S(0)", "R")}
    plan, _ = suggest_with_report(model, batch, mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo", pinned=pinned)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
    assert any(row.kind == "all_gather" and row.observed[0] for row in result.totals()), result.summary(all_rows=True)


class PaddedTriangularSolve(nn.Module):
    """The system of ``TriangularSolve``, its rows padded to the chunk and some masked out,
    solved for values projected on after (Qwen3-Next pads its sequence to whole chunks and
    masks its pairwise decays)."""

    def __init__(self, width: int, chunk: int):
        super().__init__()
        self.chunk = chunk
        self.keys = nn.Linear(width, width)
        self.values = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.register_buffer("strictly_lower", torch.ones(chunk, chunk).tril(-1))
        self.register_buffer("masked", torch.arange(chunk)[:, None] % 5 == 0)

    def forward(self, x):
        pad = (0, 0, 0, self.chunk - x.shape[-2])
        keys = nn.functional.pad(self.keys(x), pad)
        system = (keys @ keys.transpose(-1, -2)) * self.strictly_lower
        values = nn.functional.pad(self.values(x), pad).masked_fill(self.masked, 0.0)
        solved = torch.linalg.solve_triangular(system, values, upper=False, unitriangular=True)
        return self.out(solved).square().mean()


def test_a_partial_gradient_goes_through_a_triangular_solve_a_pad_and_a_fill():
    # The projection's weight split by output on dp hands the solution a gradient partial
    # on dp. DTensor solves it as partial (``P, R -> P``), its pad's backward slices it and
    # its fill fills it with zeros as partial: it is reduced at the values' projection, not
    # where the solve made it, and the matrix's is reduced at ``tril`` (before: at the
    # padded size, and the matrix's was taken for whole).
    torch.manual_seed(0)
    model, batch = PaddedTriangularSolve(64, 16), (torch.randn(8, 32, 12, 64),)
    pinned = {"[0][0]": ("R", "S(0)"), "out.weight": ("S(0)", "R")}
    plan, _ = suggest_with_report(model, batch, mesh=(2, 4), axis_names=("dp", "tp"), profile="cpu-gloo", pinned=pinned)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
