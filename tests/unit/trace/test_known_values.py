"""The trace reads values the forward made from no data (``trace/known_values.py``) and
takes the branch the eager step takes; any other value read stays a data-dependent read."""

import threading

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from autoplan.trace.known_values import known_values
from autoplan.trace.tracer import trace_model


class SkipsAllOnesMask(nn.Module):
    """A mask of ones made when none is given, applied only where it masks something
    (what transformers' mask functions do)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask=None):
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if not bool((mask.sum() == mask.numel()).item()):
            x = x.masked_fill(~mask[..., None], 0.0)
        return self.proj(x)


def _targets(gm) -> set[str]:
    return {str(node.target) for node in gm.graph.nodes if node.op == "call_function"}


def test_trace_skips_a_mask_of_ones_as_the_eager_step_does():
    with torch.device("meta"):
        model = SkipsAllOnesMask()
        traced = trace_model(model, {"x": torch.randn(2, 4, 8)}, loss_fn=lambda out, batch: out.sum())
    assert not any("masked_fill" in target for target in _targets(traced.graph_module))
    assert not traced.opaque_modules  # nothing read a value the trace could not know


def _traced_values(fn, *inputs):
    seen = {}

    def traced(*args):
        with known_values() as mode:
            out = fn(mode, seen, *args)
        return out

    make_fx(traced, tracing_mode="fake")(*inputs)
    return seen


def test_values_follow_views_casts_pointwise_ops_and_reductions():
    def fn(mode, seen, x):
        ones = torch.ones(x.shape, device=x.device)
        seen["view"] = mode.value_of(ones[:, :2].reshape(-1))
        seen["cast"] = mode.value_of(ones.to(torch.bool))
        seen["pointwise"] = mode.value_of(ones * 3 - 1)
        seen["sum"] = mode.value_of(ones.sum())
        seen["input"] = mode.value_of(x)
        seen["mixed"] = mode.value_of(ones + x)
        seen["read"] = (ones.sum() == ones.numel()).item()
        return x

    seen = _traced_values(fn, torch.randn(3, 4))
    assert seen == {"view": 1.0, "cast": True, "pointwise": 2.0, "sum": 12.0, "input": None, "mixed": None, "read": True}


def test_a_write_forgets_the_value_of_every_view_of_its_storage():
    def fn(mode, seen, x):
        ones = torch.ones(x.shape, device=x.device)
        row = ones[0]
        ones[1, 1] = 0.0
        seen["base"], seen["view"] = mode.value_of(ones), mode.value_of(row)
        filled = torch.empty(x.shape, device=x.device).fill_(7.0)
        seen["filled"] = mode.value_of(filled)
        written = torch.ones(x.shape, device=x.device)
        torch.mul(x, 2, out=written)
        seen["out="] = mode.value_of(written)
        return x

    seen = _traced_values(fn, torch.randn(3, 4))
    assert seen == {"base": None, "view": None, "filled": 7.0, "out=": None}


def test_an_unknown_value_read_stays_data_dependent():
    def fn(mode, seen, x):
        return x * 2 if bool((x > 0).all()) else x

    with pytest.raises(Exception, match="[Dd]ata.dependent|data-dependent|DataDependent"):
        _traced_values(fn, torch.randn(3, 4))


def test_transformers_sees_fake_tensors_as_before_outside_and_on_other_threads():
    import_utils = pytest.importorskip("transformers.utils.import_utils")
    original = import_utils.is_fake_tensor
    answers = {}

    def fn(mode, seen, x):
        ones = torch.ones(x.shape, device=x.device)
        answers["known"] = import_utils.is_tracing(ones)
        answers["input"] = import_utils.is_tracing(x)
        thread = threading.Thread(target=lambda: answers.update(other_thread=import_utils.is_fake_tensor(ones)))
        thread.start()
        thread.join()
        return x

    _traced_values(fn, torch.randn(3, 4))
    assert answers == {"known": False, "input": True, "other_thread": True}
    assert import_utils.is_fake_tensor is original


def test_positions_made_by_arange_are_known_through_the_ops_made_of_them():
    def fn(mode, seen, x):
        positions = (torch.arange(x.shape[1], device=x.device) + 0).unsqueeze(0).expand(x.shape[0], -1)
        seen["positions"] = mode.array_of(positions).tolist()
        # one sequence per row: the steps between positions are all one, their running sum zero
        steps = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)
        seen["steps"] = mode.value_of(steps)
        seen["read"] = bool(((steps != 1).cumsum(-1)[:, -1] == 0).all())
        seen["with input"] = mode.array_of(positions + x.long())
        return x

    seen = _traced_values(fn, torch.randn(2, 4))
    assert seen == {"positions": [[0, 1, 2, 3], [0, 1, 2, 3]], "steps": 1, "read": True, "with input": None}


def test_an_hf_decoder_given_no_mask_traces_causal_attention_without_one_at_a_real_batch():
    # transformers reads whether the position ids hold packed sequences (the eager step finds
    # one sequence per row and runs SDPA causal, no mask); 16 x 8192 positions are more than
    # SMALL, so the scan over them runs for real within ARRAY_LIMIT
    transformers = pytest.importorskip("transformers")
    batch, seq = 16, 8192
    with torch.device("meta"):
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2)
        model = transformers.AutoModelForCausalLM.from_config(config)
        inputs = {"input_ids": torch.randint(0, 128, (batch, seq)), "labels": torch.randint(0, 128, (batch, seq))}
        traced = trace_model(model, inputs)
    square = [node.name for node in traced.graph_module.graph.nodes
              if node.op == "call_function" and tuple(getattr(node.meta.get("val"), "shape", ()))[-2:] == (seq, seq)]
    assert not square, square
    assert not traced.opaque_modules
