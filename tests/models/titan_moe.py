"""torchtitan's mixture-of-experts layer (``torchtitan.models.common.moe.MoE``) in a tiny decoder.

The MoE layer is built by torchtitan's own config helpers with the settings of its
Qwen3-MoE debug flavour (softmax router, normalised top-k scores, the standard token
dispatcher), sizes shrunk (width 64, 8 experts of 96, top-2) and one layer: an embedding,
the MoE block as a residual, a head. Its grouped experts take the local shards of their
own DTensor weights, so autoplan runs them as an opaque region unless they are planned
expert parallel.
"""

import torch
from torch import nn
from torch.nn import functional as F
from torchtitan.models.common.config_utils import make_moe_config, make_routed_experts_config, make_router_config

VOCAB, WIDTH, HIDDEN, EXPERTS, TOP_K, BATCH, SEQ = 128, 64, 96, 8, 2, 8, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.RMSNorm(WIDTH)
        self.moe = make_moe_config(
            num_experts=EXPERTS,
            router=make_router_config(dim=WIDTH, num_experts=EXPERTS, gate_param_init={}, top_k=TOP_K,
                                      score_func="softmax", route_norm=True),
            routed_experts=make_routed_experts_config(dim=WIDTH, hidden_dim=HIDDEN, num_experts=EXPERTS, top_k=TOP_K,
                                                      param_init={}, comm_backend="standard"),
        ).build()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx, targets):
        x = self.embed(idx)
        x = x + self.moe(self.norm(x))
        return F.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1))


def build_model():
    model = Model()
    with torch.no_grad():
        for _name, param in model.moe.named_parameters():
            param.normal_(0.0, 0.02 if param.dim() == 3 else 0.1)
    return model


def example_inputs():
    return torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
