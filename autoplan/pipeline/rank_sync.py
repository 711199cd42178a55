"""Do a piece of work on rank 0 only and give every rank its result, as text.

``autoplan.suggest`` called on every rank of a job plans once, on rank 0, and every rank
gets the very bytes rank 0 produced: ranks never hold different plans, whatever the
solver's ties or time limits do. The text travels as two broadcasts of plain tensors (a
header, then UTF-8 bytes), never pickled. A failure on rank 0 is broadcast too, so every
rank raises instead of waiting forever for a plan that will not come.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from autoplan.errors import AutoplanError

_OK, _FAILED = 0, 1


class RankZeroError(AutoplanError):
    """The work failed on rank 0; raised on the other ranks with rank 0's message."""


def is_distributed(group=None) -> bool:
    """True when a process group of more than one rank, each its own process, is initialized.

    A fake process group (one process standing for every rank, as in tests) moves no
    data: its one process does the work itself.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size(group) > 1 and dist.get_backend(group) != "fake"


def run_on_rank_zero(produce: Callable[[], str], group=None) -> str:
    """``produce()`` on rank 0 of ``group`` (default: the world); its text on every rank.

    Without a process group of several ranks it just calls ``produce()``. Every rank of
    ``group`` must call this, in the same order as its other collectives.
    """
    if not is_distributed(group):
        return produce()
    source = dist.get_global_rank(group, 0) if group is not None else 0
    device = _device(group)
    if dist.get_rank(group) == 0:
        try:
            text, status = produce(), _OK
        except BaseException as err:
            text, status = f"{type(err).__name__}: {err}", _FAILED
            _broadcast(text, status, source, group, device)
            raise
        _broadcast(text, status, source, group, device)
        return text
    header = torch.zeros(2, dtype=torch.int64, device=device)
    dist.broadcast(header, source, group=group)
    status, length = (int(v) for v in header.tolist())
    payload = torch.empty(length, dtype=torch.uint8, device=device)
    if length:
        dist.broadcast(payload, source, group=group)
    text = bytes(payload.cpu().tolist()).decode("utf-8")
    if status != _OK:
        raise RankZeroError(f"planning failed on rank 0: {text}", hint="fix the error rank 0 reports (its traceback is in rank 0's log)")
    return text


def _broadcast(text: str, status: int, source: int, group, device) -> None:
    data = text.encode("utf-8")
    header = torch.tensor([status, len(data)], dtype=torch.int64, device=device)
    dist.broadcast(header, source, group=group)
    if data:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        dist.broadcast(payload, source, group=group)


def _device(group) -> torch.device:
    """NCCL moves only CUDA tensors; every other backend here takes CPU ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
