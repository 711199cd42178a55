"""Tokens to the ranks that hold their experts and back: all_to_all with run-time counts.

Each rank of an expert-parallel group of ``n`` ranks holds ``e = E/n`` experts, rank ``r``
experts ``r*e .. r*e+e-1``. A rank's tokens, sorted by expert, go out in ``n`` contiguous
pieces, one per owner. The sizes of the pieces are what the router decided on this step,
so the ranks first swap their per-expert counts (one ``all_to_all`` of ``E`` integers),
which tells each rank how many rows it gets from each other rank for each of its experts;
then the rows move with ``all_to_all`` of variable splits (torch's functional
``all_to_all_single_autograd``, whose backward is the reverse exchange), as torchtitan's expert parallel and DeepEP
do. Received rows arrive source-major; ``Exchange.local_order`` sorts them expert-major
for the grouped matmul, and ``combine`` undoes both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor


@dataclass(frozen=True)
class Exchange:
    """One dispatch's bookkeeping, reused by its combine."""

    group: object
    send_splits: list[int]
    """Rows this rank sends to each rank (its tokens routed to that rank's experts)."""
    recv_splits: list[int]
    """Rows this rank receives from each rank."""
    local_order: torch.Tensor
    """Received row indices in expert-major order (for each local expert, each source rank)."""
    local_counts: list[int]
    """Rows received per local expert."""


def exchange_counts(counts: torch.Tensor, group, ranks: int) -> torch.Tensor:
    """``(n, e)``: row ``s`` holds how many of rank ``s``'s rows go to each of this rank's experts."""
    counts = counts.to(torch.int64).contiguous()
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received.view(ranks, counts.numel() // ranks)


def even_counts(rows: int, experts: int) -> list[int]:
    """``rows`` spread over ``experts`` as evenly as whole rows go: the router's load taken as even."""
    return [rows // experts + (1 if i < rows % experts else 0) for i in range(experts)]


def dispatch(rows: torch.Tensor, counts: torch.Tensor, group, experts: int) -> tuple[torch.Tensor, Exchange]:
    """``rows`` (sorted by global expert, ``counts[i]`` rows for expert ``i``) sent to their
    experts' ranks; returns the rows this rank computes, expert-major, and the exchange.

    On fake tensors (a dry run that prices the plan, ``verify/dry_run.py``) the counts are
    unknown: the router's load is taken as even, every rank routing as this one does; the
    collectives run as they would, with the sizes that load gives."""
    ranks = dist.get_world_size(group)
    local = experts // ranks
    received_counts = exchange_counts(counts, group, ranks)
    if isinstance(rows, FakeTensor):
        sent = even_counts(rows.shape[0], experts)
        mine = dist.get_rank(group) * local
        received = [sent[mine:mine + local] for _ in range(ranks)]
    else:
        sent = counts.to(torch.int64).tolist()
        received = received_counts.tolist()
    send_splits = [sum(sent[r * local:(r + 1) * local]) for r in range(ranks)]
    recv_splits = [sum(row) for row in received]
    moved = _all_to_all(rows, recv_splits, send_splits, group)
    order = _expert_major(received).to(rows.device)
    exchange = Exchange(group, send_splits, recv_splits, order, [sum(col) for col in zip(*received)])
    return moved[order], exchange


def combine(rows: torch.Tensor, exchange: Exchange) -> torch.Tensor:
    """The experts' output rows (expert-major, as ``dispatch`` gave them) sent back to the
    ranks their tokens came from, in the order those ranks sent them."""
    source_major = torch.zeros_like(rows).index_copy(0, exchange.local_order, rows)
    return _all_to_all(source_major, exchange.send_splits, exchange.recv_splits, exchange.group)


def _expert_major(received: list[list[int]]) -> torch.Tensor:
    """Indices of the received rows (source-major: for each source, each local expert)
    taken for each local expert, each source."""
    starts: list[list[int]] = []
    at = 0
    for row in received:
        starts.append([])
        for count in row:
            starts[-1].append(at)
            at += count
    pieces = [torch.arange(starts[s][j], starts[s][j] + received[s][j], dtype=torch.int64)
              for j in range(len(received[0]) if received else 0) for s in range(len(received))]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def _all_to_all(rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """torch's functional all_to_all (its backward the reverse exchange), waited for."""
    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), out_splits, in_splits, group))
