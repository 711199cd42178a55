"""Sharded checkpoints of a planned model: save under one plan, load under another.

``save_checkpoint(model, optimizer, path)`` writes the model's state dict and the
optimizer's state with torch.distributed.checkpoint (DCP): every rank writes its own
shards, once each (replicated tensors are written by one rank), and rank 0 writes DCP's
``.metadata``, which records each tensor's global shape and where each piece lives.
``load_checkpoint(model, optimizer, path)`` reads into the model's current tensors in
place, each rank fetching the pieces that overlap its shards. The layout at load time is
whatever the model has then: another plan, another mesh shape, or a plain model on one
device; DCP reshards. AdamW's moments follow their parameters' placements. A pipelined
model (``apply_plan``'s ``Pipelined``) saves and loads the modules of its rank's stages,
so a checkpoint moves between plans that cut the model into other stages too.

State dicts come from ``torch.distributed.checkpoint.state_dict``: parameters by FQN
(``apply_plan`` keeps FQNs), the optimizer's state keyed by parameter FQN rather than by
position, so it survives a change of plan. Loading writes into the existing tensors, so
``apply_plan``'s gradient hooks stay attached.

A checkpoint directory is complete or absent. DCP writes its files straight into the
directory it is given and, when overwriting, deletes the old ``.metadata`` before writing
the new one, so an interrupted save would leave a mixture. Here every rank writes into a
hidden sibling, ``.<name>.partial``; after all ranks have finished (DCP's own final
collective, then a barrier) rank 0 renames it to ``path``. An existing checkpoint at
``path`` is first renamed aside (``.<name>.old``) and removed only once the new one is in
place. A failed save leaves ``path`` as it was; the next save clears the stale sibling, and
puts an aside checkpoint back if a save stopped between the two renames.

Before reading, ``load_checkpoint`` checks the checkpoint's keys and global tensor shapes
against the model's (and the optimizer's), on every rank from the same metadata,
so a mismatch is one clear error everywhere instead of a hang or a per-rank traceback.
DCP stores its metadata and non-tensor values (optimizer hyperparameters) in its own
pickled format; load checkpoints you trust.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from autoplan.apply.pipelined import Pipelined
from autoplan.errors import PlanError

MODEL_KEY = "model"
OPTIMIZER_KEY = "optimizer"
METADATA_FILE = ".metadata"  # DCP's name for it


def save_checkpoint(model: nn.Module | Pipelined, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike) -> Path:
    """Write ``model``'s (and ``optimizer``'s) state to the directory ``path``; call on every rank.

    Returns the checkpoint's path. ``path`` holds a complete checkpoint afterwards, or,
    if the save fails on any rank, whatever it held before. Every rank must see the same
    ``path`` (a shared filesystem across hosts), as DCP itself requires.
    """
    if optimizer is not None and not optimizer.state:
        # torch's get_state_dict would create the state with a zero step, which advances
        # AdamW's step count and so changes the training that follows.
        raise PlanError(
            "the optimizer has no state yet (it has not stepped)",
            hint="save after the first optimizer step, or pass optimizer=None to save the model alone",
        )
    model = _module_of(model)
    path = Path(path)
    partial, old = _siblings(path)
    rank0 = _rank() == 0
    if rank0:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted save
        if old.exists() and not path.exists():  # a save stopped between its two renames
            os.replace(old, path)
    _barrier()
    state = _state(model, optimizer)
    try:
        dcp.save(state, checkpoint_id=partial)
    except BaseException:
        if rank0:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    _barrier()  # every rank's files are written (DCP's finish also waits for all ranks)
    if rank0:
        _swap_in(partial, path)
    _barrier()  # no rank returns before the checkpoint is in place
    return path


def load_checkpoint(model: nn.Module | Pipelined, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike) -> None:
    """Read the checkpoint at ``path`` into ``model`` (and ``optimizer``) in place; call on every rank.

    ``optimizer`` may be freshly built: its state is created, then overwritten, including
    its hyperparameters (learning rate and so on), as ``Optimizer.load_state_dict`` does.
    """
    pipelined = isinstance(model, Pipelined)
    model = _module_of(model)
    path = Path(path)
    saved = _saved_items(path)
    if optimizer is not None and not any(key.startswith(OPTIMIZER_KEY + ".") for key in saved):
        raise PlanError(
            f"the checkpoint at {path} has no optimizer state",
            hint="pass optimizer=None to load the model alone, or save with the optimizer",
        )
    # The model first: building the optimizer's state dict initialises a fresh optimizer's
    # state (one step with zero gradients and zero learning rate), which a model that does
    # not match should not cause.
    _check_matches(saved, {MODEL_KEY: get_model_state_dict(model)}, path, pipelined)
    state = _state(model, optimizer)
    _check_matches(saved, state, path, pipelined)
    dcp.load(state, checkpoint_id=path)
    if optimizer is None:
        set_model_state_dict(model, state[MODEL_KEY])
    else:
        set_state_dict(model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY])


def _module_of(model) -> nn.Module:
    """The module whose state is saved: the model, or a pipelined model's stages on this rank."""
    return model.checkpoint_view() if isinstance(model, Pipelined) else model


def _state(model: nn.Module, optimizer) -> dict:
    if optimizer is None:
        return {MODEL_KEY: get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state}


def _siblings(path: Path) -> tuple[Path, Path]:
    """Where a save writes (``partial``) and where it moves the checkpoint it replaces (``old``)."""
    return path.parent / f".{path.name}.partial", path.parent / f".{path.name}.old"


def _swap_in(partial: Path, path: Path) -> None:
    """Rename ``partial`` to ``path``; an old checkpoint there is removed only afterwards."""
    _, old = _siblings(path)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(partial, path)
    _fsync_directory(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_directory(directory: Path) -> None:
    # Makes the renames durable; some filesystems cannot open a directory for this.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _saved_items(path: Path) -> dict[str, tuple[int, ...] | None]:
    """DCP's flattened key -> global shape (None for a non-tensor) of every item saved at ``path``."""
    if not path.is_dir():
        _, old = _siblings(path)
        if old.is_dir():
            hint = f"a save was interrupted while replacing it: the previous checkpoint is {old}; rename it back or save again"
        else:
            hint = "pass the directory that save_checkpoint wrote"
        raise PlanError(f"no checkpoint at {path}", hint=hint)
    if not (path / METADATA_FILE).is_file():
        raise PlanError(
            f"{path} is not a complete checkpoint (no {METADATA_FILE} file)",
            hint="pass a directory written by save_checkpoint; this one is empty, partial or of another format",
        )
    metadata = dcp.FileSystemReader(path).read_metadata()
    return {
        key: tuple(item.size) if isinstance(item, TensorStorageMetadata) else None
        for key, item in metadata.state_dict_metadata.items()
    }


def _check_matches(saved: dict[str, tuple[int, ...] | None], state: dict, path: Path, pipelined: bool = False) -> None:
    """Raise unless every item of ``state`` is in the checkpoint, each tensor with the same
    global shape, and (but for a rank's pipeline stages, which hold part of the model) every
    model tensor saved is one ``state`` has."""
    # DCP's own flattening, so the keys are exactly the ones dcp.load will look up.
    flat, _ = flatten_state_dict(state)
    wanted = {key: tuple(value.shape) if isinstance(value, torch.Tensor) else None for key, value in flat.items()}
    model_prefix = MODEL_KEY + "."
    missing = sorted(key for key in wanted if key not in saved)
    unexpected = [] if pipelined else sorted(key for key in saved if key.startswith(model_prefix) and key not in wanted)
    shapes = sorted(
        f"{key}: checkpoint {_shape(saved[key])}, model {_shape(shape)}"
        for key, shape in wanted.items()
        if key in saved and saved[key] != shape
    )
    if not (missing or unexpected or shapes):
        return
    found = []
    if missing:
        found.append(f"missing {_names(missing)}")
    if unexpected:
        found.append(f"unexpected {_names(unexpected)}")
    if shapes:
        found.append(f"shape mismatch {_names(shapes)}")
    optimizer_only = not unexpected and all(not key.startswith(model_prefix) for key in missing + shapes)
    hint = (
        "build the optimizer with the class and options used at save time, or pass optimizer=None to load the model alone"
        if optimizer_only
        else "load into a model of the same class and config as the saved one (its plan and mesh may differ)"
    )
    raise PlanError(f"the checkpoint at {path} does not match the model ({'; '.join(found)})", hint=hint)


def _shape(shape: tuple[int, ...] | None) -> str:
    return "a non-tensor" if shape is None else str(list(shape))


def _names(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"{keys[:shown]}{more}"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
