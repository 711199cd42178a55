"""Model-file loading, mesh flag parsing and atomic file writes."""

import os
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from autoplan._files import plan_default_path, write_atomic
from autoplan.errors import MeshError, ModelFileError
from autoplan.model_file import load_model_file, parse_axis_names, parse_mesh

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"  # tests/unit/ -> the checkout

GOOD_MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Linear(4, 4)

def example_inputs():
    return (torch.randn(2, 4),)
"""


def write_model(tmp_path, source, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def on_meta(loaded):
    tensors = [*loaded.model.parameters()]
    inputs = loaded.example_inputs
    tensors += list(inputs.values() if isinstance(inputs, dict) else inputs)
    return all(t.device.type == "meta" for t in tensors)


# --- examples -------------------------------------------------------------------------


def test_mlp_example_loads_on_meta():
    loaded = load_model_file(str(EXAMPLES / "mlp.py"))
    assert (loaded.name, loaded.builder) == ("mlp", "build_model")
    assert loaded.path == EXAMPLES / "mlp.py"
    assert loaded.model[0].weight.shape == (4096, 1024)
    assert loaded.example_inputs[0].shape == (64, 1024)
    assert on_meta(loaded)
    assert loaded.model(*loaded.example_inputs).shape == (64, 1024)


def test_named_builder_suffixes_the_name_and_sizes_its_batch():
    big = load_model_file(f"{EXAMPLES / 'mlp.py'}:make_big")
    assert big.name == "mlp-make_big"
    assert big.model[0].weight.shape == (4 * 8192, 8192)
    assert big.example_inputs[0].shape == (64, 8192)
    # Each load gets a fresh module, so the big load leaves no state behind.
    assert load_model_file(str(EXAMPLES / "mlp.py")).example_inputs[0].shape == (64, 1024)


def test_cnn_example_runs_on_meta():
    loaded = load_model_file(str(EXAMPLES / "cnn.py"))
    assert on_meta(loaded)
    assert any(isinstance(m, nn.BatchNorm2d) for m in loaded.model.modules())  # the zoo CNN has BatchNorm
    assert loaded.model(*loaded.example_inputs).shape == (32, 10)


def test_llama_examples_build_on_meta():
    tiny = load_model_file(str(EXAMPLES / "llama.py"))
    assert tiny.name == "llama" and on_meta(tiny)
    assert set(tiny.example_inputs) == {"input_ids", "labels"}
    assert tiny.example_inputs["input_ids"].shape == (8, 32)
    assert tiny.model.config.num_hidden_layers == 2

    big = load_model_file(str(EXAMPLES / "llama_7b.py"))
    assert big.name == "llama_7b" and on_meta(big)
    assert {p.dtype for p in big.model.parameters()} == {torch.bfloat16}
    assert big.model.model.embed_tokens.weight.shape == (32000, 4096)
    assert len(big.model.model.layers) == 2
    assert big.example_inputs["labels"].shape == (8, 2048)


# --- model file errors -------------------------------------------------------------------


def test_good_file_and_single_tensor_input(tmp_path):
    path = write_model(tmp_path, GOOD_MODEL.replace("(torch.randn(2, 4),)", "torch.randn(2, 4)"))
    loaded = load_model_file(str(path))
    assert loaded.name == "model"
    assert isinstance(loaded.example_inputs, tuple) and len(loaded.example_inputs) == 1
    assert on_meta(loaded)


def test_list_inputs_become_a_tuple(tmp_path):
    path = write_model(tmp_path, GOOD_MODEL.replace("(torch.randn(2, 4),)", "[torch.randn(2, 4)]"))
    assert isinstance(load_model_file(str(path)).example_inputs, tuple)


@pytest.mark.parametrize(
    "source, spec_suffix, expected",
    [
        (GOOD_MODEL.replace("def build_model", "def other"), "", "does not define build_model()"),
        (GOOD_MODEL, ":make_big", "does not define make_big()"),
        (GOOD_MODEL.replace("def example_inputs", "def inputs"), "", "example_inputs()"),
        (GOOD_MODEL + "\nraise RuntimeError('boom')\n", "", "RuntimeError: boom"),
        ("def build_model(:\n", "", "could not import"),
        (GOOD_MODEL.replace("return nn.Linear(4, 4)", "return 3"), "", "expected an nn.Module"),
        (GOOD_MODEL.replace("return (torch.randn(2, 4),)", "return 7"), "", "returned int"),
        (GOOD_MODEL.replace("return nn.Linear(4, 4)", "return 1 / 0"), "", "ZeroDivisionError"),
        (GOOD_MODEL, ":1bad", "expected MODEL.py or MODEL.py:BUILDER"),
    ],
)
def test_bad_model_file(tmp_path, source, spec_suffix, expected):
    path = write_model(tmp_path, source)
    with pytest.raises(ModelFileError, match=expected) as info:
        load_model_file(f"{path}{spec_suffix}")
    assert info.value.hint


def test_missing_builder_names_function_and_file(tmp_path):
    path = write_model(tmp_path, GOOD_MODEL.replace("def build_model", "def other"))
    with pytest.raises(ModelFileError) as info:
        load_model_file(str(path))
    assert str(path) in str(info.value) and "define build_model()" in info.value.hint


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(str(tmp_path / "nope.py"))


def test_not_a_python_file(tmp_path):
    path = write_model(tmp_path, GOOD_MODEL, name="model.txt")
    with pytest.raises(ModelFileError, match="not a .py file"):
        load_model_file(str(path))


# --- mesh flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, mesh", [("2x4", (2, 4)), ("8", (8,)), ("2x2x2", (2, 2, 2)), (" 1x8 ", (1, 8))]
)
def test_parse_mesh(text, mesh):
    assert parse_mesh(text) == mesh


@pytest.mark.parametrize("text", ["2x", "a", "0x4", "2*4", "", "x4", "2X4", "-2x4", "2x²"])
def test_parse_mesh_rejects_malformed(text):
    with pytest.raises(MeshError) as info:
        parse_mesh(text)
    assert info.value.hint == 'write the mesh as sizes joined by "x", e.g. --mesh 2x4'


@pytest.mark.parametrize(
    "mesh, names",
    [
        ((8,), ("dp",)),
        ((2, 4), ("dp", "tp")),
        ((2, 2, 2), ("dp", "cp", "tp")),
        ((2, 2, 2, 2), ("axis0", "axis1", "axis2", "axis3")),
    ],
)
def test_default_axis_names(mesh, names):
    assert parse_axis_names(None, mesh) == names


def test_axis_names_given():
    assert parse_axis_names("data, model", (2, 4)) == ("data", "model")


def test_axis_name_count_mismatch_names_both_counts():
    with pytest.raises(MeshError) as info:
        parse_axis_names("dp,cp,tp", (2, 4))
    assert "3 axis names" in str(info.value) and "2-axis mesh 2x4" in str(info.value)
    assert "--axis-names dp,tp" in info.value.hint


@pytest.mark.parametrize("text, expected", [("dp,dp", "distinct"), ("dp,", "non-empty")])
def test_axis_names_rejects_duplicates_and_empty(text, expected):
    with pytest.raises(MeshError, match=expected):
        parse_axis_names(text, (2, 4))


# --- files --------------------------------------------------------------------------------


def test_plan_default_path():
    assert plan_default_path("llama-make_big", (2, 4)) == Path("plans_out/llama-make_big-2x4.json")
    assert plan_default_path("mlp", (8,)) == Path("plans_out/mlp-8.json")


def test_write_atomic_creates_parents_and_replaces(tmp_path):
    target = tmp_path / "a" / "b" / "plan.json"
    write_atomic(target, "one")
    write_atomic(target, "two")
    assert target.read_text() == "two"
    assert os.listdir(target.parent) == ["plan.json"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_write_atomic_failure_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")

    def fail_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["plan.json"]  # no temp file left behind


def _umask():
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


# --- batch keys only the loss reads ------------------------------------------------------

CLASSIFIER = """
import torch
import torch.nn.functional as F
from torch import nn

LOSS_INPUTS = ("labels",)

def build_model():
    return nn.Linear(4, 3)

def example_inputs():
    return {"input": torch.randn(2, 4), "labels": torch.randint(0, 3, (2,))}

def compute_loss(output, batch):
    return F.cross_entropy(output, batch["labels"])
"""


def test_loss_inputs_are_read_with_the_loss(tmp_path):
    from autoplan.model_file import LossWithInputs, model_call_kwargs

    loaded = load_model_file(str(write_model(tmp_path, CLASSIFIER)))
    assert isinstance(loaded.loss_fn, LossWithInputs) and loaded.loss_fn.inputs == ("labels",)
    assert loaded.loss_fn.__name__ == "compute_loss"
    assert list(model_call_kwargs(loaded.example_inputs, loaded.loss_fn)) == ["input"]
    assert list(model_call_kwargs(loaded.example_inputs, None)) == ["input", "labels"]


@pytest.mark.parametrize(
    "source, expected",
    [
        (CLASSIFIER.replace('("labels",)', '"labels"'), "expected a tuple of batch key names"),
        (CLASSIFIER.replace("def compute_loss", "def other_loss"), "defines LOSS_INPUTS but no compute_loss"),
    ],
)
def test_bad_loss_inputs(tmp_path, source, expected):
    with pytest.raises(ModelFileError, match=expected) as info:
        load_model_file(str(write_model(tmp_path, source)))
    assert info.value.hint


@pytest.mark.parametrize(
    "source, expected",
    [
        (CLASSIFIER.replace('("labels",)', '("targets",)'), r"name \['targets'\], which the batch lacks"),
        (CLASSIFIER.replace('("labels",)', '("input", "labels")'), "are every key of the batch"),
        (CLASSIFIER.replace('return {"input": torch.randn(2, 4), "labels": torch.randint(0, 3, (2,))}',
                            "return (torch.randn(2, 4), torch.randint(0, 3, (2,)))"), "not a dict"),
    ],
)
def test_loss_inputs_the_batch_cannot_give(tmp_path, source, expected):
    from autoplan.trace.tracer import trace_model

    loaded = load_model_file(str(write_model(tmp_path, source)))
    with pytest.raises(ModelFileError, match=expected) as info:
        trace_model(loaded.model, loaded.example_inputs, loaded.loss_fn)
    assert info.value.hint
