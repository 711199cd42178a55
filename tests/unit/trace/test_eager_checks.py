"""The trace runs transformers' padding check as the eager step does (``trace/eager_checks.py``):
called without an attention mask, a model compares each row's first and last token with the
pad token, which DTensor may move; the check returns at once while tracing, so the trace
lacked it."""

import pytest
import torch

from autoplan.trace.tracer import trace_model

transformers = pytest.importorskip("transformers")


def _tiny_deberta():
    config = transformers.DebertaConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, pad_token_id=0,
    )
    return transformers.DebertaModel(config)  # its forward runs the check (BERT's no longer does)


def _ops(traced) -> list[str]:
    return [str(node.target) for node in traced.graph_module.graph.nodes if node.op == "call_function"]


def _trace(batch):
    with torch.device("meta"):
        model = _tiny_deberta()
    return trace_model(model, batch, loss_fn=lambda out, batch: out.last_hidden_state.sum())


@pytest.mark.slow  # traces a (tiny) DeBERTa twice
def test_the_padding_check_is_traced_where_the_eager_step_runs_it():
    ids = torch.randint(1, 32, (4, 8))
    assert "aten.any.default" in _ops(_trace({"input_ids": ids}))
    # Given a mask, the eager step checks nothing, and neither does the trace.
    assert "aten.any.default" not in _ops(_trace({"input_ids": ids, "attention_mask": torch.ones(4, 8, dtype=torch.long)}))


@pytest.mark.slow  # traces a (tiny) DeBERTa
def test_the_check_is_transformers_own_outside_the_trace():
    original = transformers.modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask
    _trace({"input_ids": torch.randint(1, 32, (4, 8))})
    assert transformers.modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask is original
