"""Context parallel pieces (``autoplan/dtensor/context_attention.py``): the load-balanced
order, the attention rule on the context axis, the checks on what it runs; the batch helper
(``autoplan/sequence_batch.py``) and the plan's record of the layout. Numerics on gloo:
``tests/integration/apply/test_context_parallel_gloo.py``."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard

from autoplan.dtensor import context_attention, overrides
from autoplan.dtensor.fused_attention import FUSED_FORWARD
from autoplan.errors import PlanError
from autoplan.plan.module_plan import ContextLayout
from autoplan.sequence_batch import causal_lm_batch


def test_rank_r_holds_chunks_r_and_2n_minus_1_minus_r():
    order = context_attention.sequence_order(16, 4).tolist()  # 8 chunks of 2 tokens
    chunks = [order[i] // 2 for i in range(0, 16, 2)]
    assert chunks == [0, 7, 1, 6, 2, 5, 3, 4]
    assert order[:4] == [0, 1, 14, 15]
    tokens = torch.arange(16)[None]
    assert context_attention.load_balanced(tokens, 1, 4).tolist() == [order]


def test_a_sequence_that_cannot_be_cut_evenly_is_refused():
    with pytest.raises(PlanError, match="cannot be split in 8 equal chunks"):
        context_attention.sequence_order(20, 4)


def test_active_sets_and_restores_the_axis():
    assert context_attention.current_axis() is None
    with context_attention.active(1):
        assert context_attention.current_axis() == 1
        with context_attention.active(None):
            assert context_attention.current_axis() == 1
    assert context_attention.current_axis() is None


def _split(mesh, *shape):
    return DTensor.from_local(torch.randn(*shape), mesh, [Shard(0), Shard(2)], run_check=False)


def test_the_cpu_attention_rule_splits_the_sequence_only_on_the_context_axis(fake_mesh_2x4):
    q, k, v = (_split(fake_mesh_2x4, 1, 2, 8, 4) for _ in range(3))
    with overrides.installed(), context_attention.active(1):
        out, lse = FUSED_FORWARD(q, k, v, 0.0, True)[:2]
    assert out.placements == (Shard(0), Shard(2)) and lse.placements == (Shard(0), Shard(2))
    with overrides.installed():  # no context axis: attention cannot run on a split sequence
        out, _ = FUSED_FORWARD(q, k, v, 0.0, True)[:2]
    assert out.placements[1] != Shard(2)


def test_split_attention_refuses_a_mask(fake_mesh_2x4):
    q, k, v = (_split(fake_mesh_2x4, 1, 2, 8, 4) for _ in range(3))
    mask = torch.ones(8, 32, dtype=torch.bool)
    with context_attention.active(1):
        with pytest.raises(PlanError, match="causal attention without a mask"):
            context_attention.split_attention((q, k, v), {"attn_mask": mask})
        assert context_attention.split_attention((q, k, v), {"is_causal": True}) is not None
    assert context_attention.split_attention((q, k, v), {"is_causal": True}) is None  # no context axis


def test_the_lower_right_mask_lets_each_query_see_the_keys_up_to_its_own():
    mask = context_attention._lower_right_causal(2, 6, torch.empty(0))
    assert mask.tolist() == [[True] * 5 + [False], [True] * 6]
    assert context_attention._lower_right_causal(3, 3, torch.empty(0)) is None
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 4)
    whole = F.scaled_dot_product_attention(torch.cat([torch.randn(1, 1, 4, 4), q], 2), k, v, is_causal=True)
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), whole[:, :, 4:], atol=1e-6)


def test_the_causal_lm_batch_is_shifted_and_numbered_beforehand():
    tokens = torch.tensor([[5, 6, 7, 8]])
    batch = causal_lm_batch(tokens, tokens + 10)
    assert batch["shift_labels"].tolist() == [[16, 17, 18, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1]]


def test_the_context_layout_round_trips():
    layout = ContextLayout("cp", 1, 4, sequence_inputs=("[1]['input_ids']",), alternative_step_s=2.5)
    assert ContextLayout.from_dict(layout.to_dict()) == layout
    assert "alternative_step_s" not in ContextLayout("cp", 0, 2).to_dict()
