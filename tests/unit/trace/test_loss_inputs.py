"""Batch keys only the loss reads: the traced step takes them, the model is called without them."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoplan.errors import ArgumentTypeError
from autoplan.model_file import LossWithInputs
from autoplan.trace.tracer import trace_model


class Classifier(nn.Module):
    """An image classifier as timm writes one: its forward takes the images only."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(12, 5)

    def forward(self, pixels):
        return self.head(pixels.flatten(1))


def _loss(output, batch):
    return F.cross_entropy(output, batch["labels"])


def _batch():
    with torch.device("meta"):
        return {"pixels": torch.randn(4, 3, 2, 2), "labels": torch.randint(0, 5, (4,))}


def test_the_labels_are_an_input_of_the_step_and_not_of_the_model():
    with torch.device("meta"):
        model = Classifier()
    traced = trace_model(model, _batch(), LossWithInputs(_loss, ("labels",)))
    assert sorted(traced.inputs.values()) == ["[1]['labels']", "[1]['pixels']"]
    labels = next(node for node, path in traced.inputs.items() if path == "[1]['labels']")
    readers = [user.target for user in traced.graph_module.graph.find_nodes(op="placeholder", target=labels)[0].users]
    assert readers and all("nll_loss" in str(target) for target in readers)  # only the loss reads them
    [root] = [call for call in traced.module_calls if call.fqn == ""]
    assert [path for path, _ in root.inputs] == ["[1]['pixels']"]


def test_without_the_loss_inputs_the_model_gets_every_key():
    with torch.device("meta"):
        model = Classifier()
    with pytest.raises(Exception, match="labels"):
        trace_model(model, _batch(), _loss)


def test_loss_with_inputs_wants_a_function_and_key_names():
    with pytest.raises(ArgumentTypeError, match="not a function"):
        LossWithInputs("cross_entropy", ("labels",))
    with pytest.raises(ArgumentTypeError, match="tuple of key names"):
        LossWithInputs(_loss, "labels")
