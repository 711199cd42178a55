"""The Python API's arguments, checked at the boundary with the command line's rules.

``autoplan suggest --mesh 2x4 --axis-names dp,tp --memory-gb 40`` and
``autoplan.suggest(model, inputs, mesh=(2, 4), axis_names=("dp", "tp"), memory_gb=40)``
accept and refuse the same things, with autoplan's errors: a wrong type is an
``ArgumentTypeError`` (a ``TypeError``), a bad value a ``MeshError`` or ``OptionError``
(``ValueError``s).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings

import torch
from torch import nn

from autoplan.errors import ArgumentTypeError, MeshError, OptionError

LARGE_MESH_DEVICES = 65536
"""Above this many devices a mesh is likely a typo (the largest jobs run ~100k GPUs): warned."""
_MESH_HINT = "pass the mesh as a tuple of sizes, e.g. mesh=(2, 4)"


def check_mesh(mesh) -> tuple[int, ...]:
    """A mesh as a tuple of whole sizes >= 1 (a bare int is a 1-D mesh)."""
    if isinstance(mesh, numbers.Integral) and not isinstance(mesh, bool):
        mesh = (mesh,)
    if isinstance(mesh, (str, bytes)) or not isinstance(mesh, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"expected a mesh as a tuple of sizes, got {type(mesh).__name__} {mesh!r}", _MESH_HINT)
    if not mesh:
        raise MeshError("expected a mesh with at least one axis, got ()", _MESH_HINT)
    for size in mesh:
        if not isinstance(size, numbers.Integral) or isinstance(size, bool):
            raise ArgumentTypeError(f"expected whole mesh sizes, got {size!r} in mesh {tuple(mesh)!r}", _MESH_HINT)
        if size < 1:
            raise MeshError(f"mesh axis sizes must be at least 1, got {tuple(mesh)!r}", _MESH_HINT)
    return tuple(int(size) for size in mesh)


def warn_if_large(mesh: tuple[int, ...]) -> None:
    devices = math.prod(mesh)
    if devices > LARGE_MESH_DEVICES:
        warnings.warn(
            f"autoplan: mesh {'x'.join(map(str, mesh))} has {devices} devices, more than any cluster "
            f"autoplan has planned for (over {LARGE_MESH_DEVICES}); check the mesh",
            stacklevel=3,
        )


def check_axis_names(names, mesh: tuple[int, ...]) -> tuple[str, ...]:
    """One distinct identifier per mesh axis."""
    example = {1: "'dp',", 2: "'dp', 'tp'", 3: "'dp', 'cp', 'tp'"}.get(len(mesh), "'a0', 'a1', ...")
    hint = f"give one distinct name per mesh axis, e.g. axis_names=({example})"
    if isinstance(names, (str, bytes)) or not isinstance(names, (tuple, list)):
        raise ArgumentTypeError(f"expected axis names as a tuple of strings, got {type(names).__name__} {names!r}", hint)
    if not all(isinstance(name, str) and name.isidentifier() for name in names):
        raise MeshError(f"axis names must be non-empty identifiers, got {tuple(names)!r}", hint)
    if len(set(names)) != len(names):
        raise MeshError(f"axis names must be distinct, got {tuple(names)!r}", hint)
    if len(names) != len(mesh):
        raise MeshError(f"got {len(names)} axis names {tuple(names)!r} for the {len(mesh)}-axis mesh {'x'.join(map(str, mesh))}", hint)
    return tuple(names)


def check_positive(name: str, value) -> float | None:
    """None, or a finite number > 0 (``memory_gb``, ``time_limit_s``)."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ArgumentTypeError(f"expected {name} as a number, got {type(value).__name__} {value!r}", f"pass e.g. {name}=40")
    if not (math.isfinite(value) and float(value) > 0):
        raise OptionError(f"expected {name} > 0, got {value!r}", f"pass a positive {name}, or None for the default")
    return float(value)


def check_profile(profile) -> None:
    """None, a profile name or path, or a loaded ClusterProfile."""
    from autoplan.cost.profile import ClusterProfile

    if profile is not None and not isinstance(profile, (str, os.PathLike, ClusterProfile)):
        raise ArgumentTypeError(
            f"expected profile as a name, a path or a ClusterProfile, got {type(profile).__name__}",
            "pass e.g. profile=\"h100-sxm\" or profile=autoplan.load_profile(path)",
        )


def check_model(model, example_inputs) -> None:
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(
            f"expected the model as an nn.Module, got {type(model).__name__} {model!r:.60}",
            "build the model first (e.g. under torch.device('meta')); the command line takes a model file",
        )
    if not isinstance(example_inputs, (tuple, list, dict, torch.Tensor)):
        raise ArgumentTypeError(
            f"expected example_inputs as a tuple of positional arguments or a dict of keyword arguments, "
            f"got {type(example_inputs).__name__}",
            "pass e.g. (torch.randn(64, 1024),) or dict(input_ids=...)",
        )
