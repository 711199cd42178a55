"""``apply/stages.py``: a stage keeps its modules, the model's forward runs through what is
left, and stage after stage computes what the whole model does."""

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from autoplan.apply.pipelined import _check_stage_ranks
from autoplan.apply.stages import PassThrough, keep_stage
from autoplan.errors import PlanError
from autoplan.plan.pipeline_plan import PipelinePlan, Stage


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=4, max_position_embeddings=16, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def _pipeline(*stages):
    return PipelinePlan("pp", len(stages), 0, "GPipe" if len(stages) == 1 else "1F1B", 2,
                        tuple(Stage(tuple(modules), rank) for rank, modules in enumerate(stages)))


LLAMA_STAGES = (("model.embed_tokens", "model.layers.0", "model.layers.1"), ("model.layers.2", "model.layers.3", "model.norm", "lm_head"))


def test_each_stage_keeps_its_own_parameters_under_their_fqns():
    model = _llama()
    names = [fqn for fqn, _ in model.named_parameters()]
    pipeline = _pipeline(*LLAMA_STAGES)
    for index, own in enumerate(LLAMA_STAGES):
        stage = copy.deepcopy(model)
        removed = keep_stage(stage, pipeline, index)
        kept = [fqn for fqn, _ in stage.named_parameters()]
        assert kept == [fqn for fqn in names if any(fqn.startswith(m + ".") for m in own)]
        assert removed == set(LLAMA_STAGES[1 - index])
    first = copy.deepcopy(model)
    keep_stage(first, pipeline, 0)
    assert isinstance(first.lm_head, PassThrough) and isinstance(first.model.norm, PassThrough)
    assert len(first.model.layers) == 2  # layers 2 and 3 deleted, 0 and 1 keep their keys


def test_stages_in_turn_compute_the_whole_models_loss_and_gradients():
    model = _llama()
    pipeline = _pipeline(*LLAMA_STAGES)
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    keep_stage(first, pipeline, 0)
    keep_stage(last, pipeline, 1)
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    whole = model(input_ids=ids, labels=labels).loss
    whole.backward()
    activation = first(input_ids=ids).logits  # the first stage's output: the hidden states after layer 1
    assert activation.shape == (2, 8, 32)
    received = activation.detach().requires_grad_()
    loss = last(input_ids=received, labels=labels).loss
    loss.backward()
    activation.backward(received.grad)
    torch.testing.assert_close(loss, whole)
    grads = {fqn: p.grad for m in (first, last) for fqn, p in m.named_parameters()}
    assert set(grads) == {fqn for fqn, _ in model.named_parameters()}
    for fqn, param in model.named_parameters():
        torch.testing.assert_close(grads[fqn], param.grad, msg=fqn)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.linear(x))


class _TitanStyle(nn.Module):
    """Blocks in a ModuleDict, as torchtitan's models hold them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleDict({str(i): _Block() for i in range(4)})
        self.norm = nn.LayerNorm(8)
        self.output = nn.Linear(8, 16)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def test_module_dict_blocks_and_a_middle_stage():
    torch.manual_seed(0)
    model = _TitanStyle()
    stages = (("embed", "layers.0"), ("layers.1", "layers.2"), ("layers.3", "norm", "output"))
    pipeline = _pipeline(*stages)
    parts = []
    for index in range(3):
        part = copy.deepcopy(model)
        keep_stage(part, pipeline, index)
        parts.append(part)
    assert list(parts[1].layers.keys()) == ["1", "2"]
    assert isinstance(parts[1].embed, PassThrough) and isinstance(parts[1].output, PassThrough)
    tokens = torch.randint(0, 16, (3, 5))
    h = tokens
    for part in parts:
        h = part(h)
    torch.testing.assert_close(h, model(tokens))


def test_stages_on_ranks_the_schedule_does_not_use_are_refused():
    looped = PipelinePlan("pp", 2, 0, "Interleaved1F1B", 2, tuple(Stage((f"{i}",), i % 2) for i in range(4)))
    _check_stage_ranks(looped)
    v_shape = PipelinePlan("pp", 2, 0, "ZBVZeroBubble", 2, tuple(Stage((f"{i}",), r) for i, r in enumerate((0, 1, 1, 0))))
    _check_stage_ranks(v_shape)
    wrong = PipelinePlan("pp", 2, 0, "Interleaved1F1B", 2, tuple(Stage((f"{i}",), r) for i, r in enumerate((0, 1, 1, 0))))
    with pytest.raises(PlanError, match="stage 2 is on pipeline rank 1, but Interleaved1F1B runs it on rank 0"):
        _check_stage_ranks(wrong)
