"""Load a user's model file and parse the mesh flags.

A model file is a plain Python file that defines two functions, and may define a third::

    def build_model() -> nn.Module: ...
    def example_inputs() -> tuple | dict: ...   # one global batch
    def compute_loss(output, batch) -> torch.Tensor: ...   # optional: the training loss

Both are called under ``torch.device("meta")`` so no weight or batch memory is used. The
builder is called first, so ``example_inputs`` may read what the builder recorded (a file
with several builders can size its batch that way).

``compute_loss`` gets the model's output and the batch it was called with (the dict or
tuple ``example_inputs`` returns, each rank's slice of it once a plan is applied) and
returns the loss as a scalar tensor; autoplan plans, applies, verifies and checks the
numerics of that loss. Without it the loss is the model's own: ``output.loss``,
``output["loss"]``, or the one scalar tensor the model returns (``trace/loss.py``).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.errors import MeshError, ModelFileError

if TYPE_CHECKING:
    from torch import nn

# torch is imported where a model is built, not at import: `autoplan --help` and the mesh
# flags' parsing do not wait for it.

DEFAULT_BUILDER = "build_model"
LOSS_FUNCTION = "compute_loss"
_MESH_HINT = 'write the mesh as sizes joined by "x", e.g. --mesh 2x4'
_DEFAULT_AXIS_NAMES = {1: ("dp",), 2: ("dp", "tp"), 3: ("dp", "cp", "tp")}


def default_axis_names(mesh: tuple[int, ...]) -> tuple[str, ...]:
    """The axis names a mesh gets when none are given (the command line's and the API's)."""
    return _DEFAULT_AXIS_NAMES.get(len(mesh), tuple(f"axis{i}" for i in range(len(mesh))))
# A fresh module name per load: loading the same file twice must not reuse stale state.
_load_counter = itertools.count()


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model file's model and example batch, both on the meta device."""

    name: str
    """File stem, plus "-BUILDER" when a non-default builder is used (e.g. "llama-make_big")."""
    path: Path
    """The model file."""
    builder: str
    """Name of the function that built the model."""
    model: nn.Module
    """The model, with meta parameters."""
    example_inputs: tuple | dict
    """One global batch: positional arguments (tuple) or keyword arguments (dict)."""
    loss_fn: Callable | None = None
    """The file's ``compute_loss(output, batch)``; None: the model's own loss."""


def load_model_file(spec: str) -> LoadedModel:
    """Load ``path/to/model.py`` or ``path/to/model.py:BUILDER`` (default build_model)."""
    path, builder = _split_spec(spec)
    module = import_model_file(path)
    build = _require_function(module, builder, path, "that returns the nn.Module to plan")
    make_inputs = _require_function(
        module, "example_inputs", path, "that returns one batch as a tuple or dict of tensors"
    )
    loss_fn = loss_function(module, path)
    import torch

    with torch.device("meta"):
        model = _call(build, path)
        inputs = _call(make_inputs, path)
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(
            f"{builder}() in {path} returned {type(model).__name__}, expected an nn.Module",
            f"make {builder}() return the model",
        )
    name = path.stem if builder == DEFAULT_BUILDER else f"{path.stem}-{builder}"
    return LoadedModel(name, path, builder, model, _normalize_inputs(inputs, path), loss_fn)


def loss_function(module, path: Path) -> Callable | None:
    """An imported model file's ``compute_loss``, or None where it defines none."""
    function = getattr(module, LOSS_FUNCTION, None)
    if function is not None and not callable(function):
        raise ModelFileError(
            f"{path} defines {LOSS_FUNCTION} as a {type(function).__name__}, not a function",
            f"define {LOSS_FUNCTION}(output, batch) in {path} that returns the loss as a scalar tensor, "
            "or remove it to use the model's own loss",
        )
    return function


def parse_mesh(text: str) -> tuple[int, ...]:
    """``"2x4"`` -> ``(2, 4)``; ``"8"`` -> ``(8,)``."""
    parts = text.strip().split("x")
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise MeshError(f"expected a mesh like 2x4, got {text!r}", _MESH_HINT)
    sizes = tuple(int(part) for part in parts)
    if any(size < 1 for size in sizes):
        raise MeshError(f"mesh axis sizes must be at least 1, got {text!r}", _MESH_HINT)
    return sizes


def parse_axis_names(text: str | None, mesh: tuple[int, ...]) -> tuple[str, ...]:
    """Comma-separated axis names, one per mesh axis; ``None`` gives the default names."""
    if text is None:
        return default_axis_names(mesh)
    names = tuple(name.strip() for name in text.split(","))
    example = ",".join(parse_axis_names(None, mesh))
    hint = f"give one distinct name per mesh axis, e.g. --axis-names {example}"
    if not all(name.isidentifier() for name in names):
        raise MeshError(f"axis names must be non-empty identifiers, got {text!r}", hint)
    if len(set(names)) != len(names):
        raise MeshError(f"axis names must be distinct, got {text!r}", hint)
    if len(names) != len(mesh):
        shape = "x".join(map(str, mesh))
        raise MeshError(
            f"got {len(names)} axis names ({text}) for the {len(mesh)}-axis mesh {shape}", hint
        )
    return names


def _split_spec(spec: str) -> tuple[Path, str]:
    path_text, colon, builder = spec.rpartition(":")
    if not colon:
        path_text, builder = spec, DEFAULT_BUILDER
    if not builder.isidentifier():
        raise ModelFileError(
            f"expected MODEL.py or MODEL.py:BUILDER, got {spec!r}",
            "name the builder function after the colon, e.g. examples/mlp.py:make_big",
        )
    path = Path(path_text)
    if not path.exists():
        raise ModelFileError(f"model file {path} does not exist", "check the model file's path")
    if not path.is_file() or path.suffix != ".py":
        raise ModelFileError(
            f"model file {path} is not a .py file", "pass a Python file that defines build_model()"
        )
    return path, builder


def import_model_file(path: Path):
    """Import a model file as a fresh module (not calling its builder); errors name the file."""
    module_name = f"_autoplan_model_{next(_load_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, path  # a .py path always has a source loader
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs so dataclasses and pickling inside the file can find it.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exit_:  # a script-style file: not autoplan's exit
        del sys.modules[module_name]
        raise ModelFileError(
            f"{path} called sys.exit({exit_.code!r}) while being imported",
            f"guard the script part of {path} with `if __name__ == \"__main__\":`",
        ) from None
    except Exception as err:
        del sys.modules[module_name]
        raise ModelFileError(
            f"could not import {path}: {type(err).__name__}: {err}",
            f"fix the error in {path} (rerun with --debug for the traceback)",
        ) from err
    return module


def _require_function(module, name: str, path: Path, purpose: str):
    function = getattr(module, name, None)
    if not callable(function):
        problem = "does not define" if function is None else "defines a non-function"
        raise ModelFileError(f"{path} {problem} {name}()", f"define {name}() in {path} {purpose}")
    return function


def _call(function, path: Path):
    try:
        return function()
    except SystemExit as exit_:
        raise ModelFileError(
            f"{function.__name__}() in {path} called sys.exit({exit_.code!r})",
            f"make {function.__name__}() return instead of exiting",
        ) from None
    except Exception as err:
        name = function.__name__
        raise ModelFileError(
            f"{name}() in {path} raised {type(err).__name__}: {err}",
            f"fix {name}() (rerun with --debug for the traceback)",
        ) from err


def _normalize_inputs(inputs, path: Path) -> tuple | dict:
    import torch

    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    if isinstance(inputs, dict) and all(isinstance(key, str) for key in inputs):
        return dict(inputs)
    raise ModelFileError(
        f"example_inputs() in {path} returned {type(inputs).__name__}, "
        "expected a tuple of positional arguments or a dict of keyword arguments",
        "return e.g. (torch.randn(64, 1024),) or dict(input_ids=...)",
    )
