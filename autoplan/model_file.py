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

A file with ``compute_loss`` and a dict batch may also name the batch keys that only the
loss reads, which the model takes no argument for (an image classifier's labels, a
denoiser's noise target)::

    LOSS_INPUTS = ("labels",)

The model is then called with the rest of the batch (``model(**inputs)``), and
``compute_loss`` gets the whole batch; the trace, ``apply_plan``, ``verify`` and the
numerics check all call it so (``LossWithInputs``).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.errors import ArgumentTypeError, MeshError, ModelFileError

if TYPE_CHECKING:
    from torch import nn

# torch is imported where a model is built, not at import: `autoplan --help` and the mesh
# flags' parsing do not wait for it.

DEFAULT_BUILDER = "build_model"
LOSS_FUNCTION = "compute_loss"
LOSS_INPUTS = "LOSS_INPUTS"
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


@dataclass(frozen=True, slots=True)
class LossWithInputs:
    """A training loss ``function(output, batch)`` and the batch keys only it reads
    (``inputs``): the model is called with the batch without them, the loss gets the whole
    batch. A model file says so with ``LOSS_INPUTS``; in Python, pass
    ``loss_fn=autoplan.LossWithInputs(compute_loss, ("labels",))`` to ``suggest``,
    ``apply_plan`` and ``verify_plan``."""

    function: Callable
    inputs: tuple[str, ...]

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ArgumentTypeError(
                f"LossWithInputs got a {type(self.function).__name__} as its loss, not a function",
                "pass the loss function first: LossWithInputs(compute_loss, (\"labels\",))",
            )
        if isinstance(self.inputs, str) or not all(isinstance(key, str) for key in self.inputs):
            raise ArgumentTypeError(
                f"the loss-only batch keys must be a tuple of key names, got {self.inputs!r}",
                'write them as a tuple of strings, e.g. LOSS_INPUTS = ("labels",)',
            )

    def __call__(self, output, batch):
        return self.function(output, batch)

    @property
    def __name__(self) -> str:  # error messages name the user's function
        return getattr(self.function, "__name__", "loss_fn")


def loss_only_keys(loss_fn) -> tuple[str, ...]:
    """The batch keys only ``loss_fn`` reads (``LossWithInputs.inputs``); () for any other loss."""
    return loss_fn.inputs if isinstance(loss_fn, LossWithInputs) else ()


def model_call_kwargs(kwargs: dict, loss_fn) -> dict:
    """The keyword arguments the model is called with: the batch without the keys only
    ``loss_fn`` reads."""
    drop = loss_only_keys(loss_fn)
    return {key: value for key, value in kwargs.items() if key not in drop} if drop else kwargs


def check_loss_inputs(loss_fn, batch) -> None:
    """The loss-only keys, where ``loss_fn`` names some, are keys of a dict batch."""
    keys = loss_only_keys(loss_fn)
    if not keys:
        return
    if not isinstance(batch, dict):
        raise ModelFileError(
            f"the loss-only batch keys ({LOSS_INPUTS}) are {list(keys)}, but the batch is a {type(batch).__name__}, not a dict",
            "return the batch from example_inputs() as a dict of keyword arguments (the model's and the loss's)",
        )
    missing = [key for key in keys if key not in batch]
    if missing:
        raise ModelFileError(
            f"the loss-only batch keys ({LOSS_INPUTS}) name {missing}, which the batch lacks (its keys: {sorted(batch)})",
            f"name in {LOSS_INPUTS} only keys example_inputs() returns",
        )
    if all(key in keys for key in batch):
        raise ModelFileError(
            f"the loss-only batch keys ({LOSS_INPUTS}) are every key of the batch ({sorted(batch)}): the model would get no input",
            f"name in {LOSS_INPUTS} only the keys the loss alone reads",
        )


def loss_function(module, path: Path) -> Callable | None:
    """An imported model file's ``compute_loss``, or None where it defines none; with its
    ``LOSS_INPUTS``, a ``LossWithInputs``."""
    function = getattr(module, LOSS_FUNCTION, None)
    if function is not None and not callable(function):
        raise ModelFileError(
            f"{path} defines {LOSS_FUNCTION} as a {type(function).__name__}, not a function",
            f"define {LOSS_FUNCTION}(output, batch) in {path} that returns the loss as a scalar tensor, "
            "or remove it to use the model's own loss",
        )
    keys = getattr(module, LOSS_INPUTS, None)
    if keys is None:
        return function
    if function is None:
        raise ModelFileError(
            f"{path} defines {LOSS_INPUTS} but no {LOSS_FUNCTION}: the model's own loss reads no batch key",
            f"define {LOSS_FUNCTION}(output, batch) in {path}, or remove {LOSS_INPUTS}",
        )
    if isinstance(keys, str) or not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) for k in keys):
        raise ModelFileError(
            f"{path} defines {LOSS_INPUTS} as {keys!r}, expected a tuple of batch key names",
            f'write e.g. {LOSS_INPUTS} = ("labels",) in {path}',
        )
    return LossWithInputs(function, tuple(keys))


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
