"""A gradient split where its op made the output whole goes back split through an op of one
tensor whose backward reads nothing but that gradient, where DTensor's rules keep the
split (``plan/split_gradients.gradient_only_split``): a pad's backward pads it back
(``constant_pad_nd``), a cumulative sum's sums it reversed (``flip``, ``cumsum``, ``flip``).

A Mamba-2 mixer (NemotronH, Zamba2) pads its sequence to whole chunks and sums each
head's decay along it; its skip weight ``D``, split by heads on dp, makes its output
split by heads there, and the gradient comes back to the decay split by heads. The
prediction had it gathered at the cumulative sum and at the pad; DTensor keeps it split
to the step sizes, and ``A_log`` gets its gradient split by heads on dp and partial on tp
(an all_reduce on tp of half of it, then an all_gather on dp).
"""

import torch
from torch import nn
from torch.nn import functional as F
from zoo import verify_on_fake_world

from autoplan.errors import InfeasibleError
from autoplan.pipeline.suggest import suggest_with_report

MESH, AXIS_NAMES = (2, 4), ("dp", "tp")


class ChunkedDecay(nn.Module):
    """The per-head part of a Mamba-2 scan: step sizes ``dt`` per token and head, the decay
    ``-exp(A_log) * dt`` summed along the sequence padded to whole chunks, and a skip ``D``."""

    def __init__(self, width: int = 128, heads: int = 16, head_dim: int = 16, chunk: int = 16):
        super().__init__()
        self.heads, self.head_dim, self.chunk = heads, head_dim, chunk
        self.in_proj = nn.Linear(width, heads * head_dim + heads)
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.D = nn.Parameter(torch.ones(heads))
        self.out_proj = nn.Linear(heads * head_dim, width)

    def forward(self, x):
        batch, length, _ = x.shape
        values, dt = self.in_proj(x).split([self.heads * self.head_dim, self.heads], dim=-1)
        values = values.view(batch, length, self.heads, self.head_dim)
        pad = (self.chunk - length % self.chunk) % self.chunk
        decay = F.pad(-torch.exp(self.A_log) * F.softplus(dt), (0, 0, 0, pad))
        decay = torch.exp(torch.cumsum(decay, dim=1))[:, :length]
        out = decay[..., None] * values + self.D[:, None] * values
        return self.out_proj(out.reshape(batch, length, -1)).sum()


def test_a_gradient_split_by_heads_goes_back_split_through_the_pad_and_the_cumulative_sum():
    torch.manual_seed(0)
    model, batch = ChunkedDecay(), (torch.randn(32, 60, 128),)
    # tokens split on tp, the skip weight by heads on dp, the rest of the mixer's
    # parameters as a forcing budget leaves them
    pinned = {"[0][0]": ("R", "S(0)"), "D": ("S(0)", "R"), "A_log": ("R", "R"),
              "in_proj.weight": ("R", "R"), "in_proj.bias": ("R", "R")}

    def plan(memory_gib):
        return suggest_with_report(model, batch, MESH, AXIS_NAMES, memory_gib=memory_gib, pinned=pinned)[0]

    try:
        plan(1e-12)
    except InfeasibleError as err:
        least = err.smallest_bytes
    forced = plan(1.05 * least / 2**30)
    result = verify_on_fake_world(model, batch, forced)
    assert result.passed, "\n" + result.summary()
