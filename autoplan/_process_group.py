"""One process group for the life of a rank: joined, used, and left together.

A gloo rank that leaves (``destroy_process_group`` closes its connections) while a peer
still reads from one of them makes that peer's transport thread throw, and the peer dies
with ``SIGABRT`` ("terminate called without an active exception"): one rank finishing its
last collective first does not mean every rank has. So a rank that finished its work
waits at a barrier before it leaves. A rank that failed leaves at once: the others are
stuck in a collective it will never join and fail on their own timeout or on its exit,
and a barrier would only add that timeout to the failure.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def process_group(backend: str, **init_kwargs):
    """``init_process_group(backend, **init_kwargs)`` for the ``with`` body; afterwards every
    rank leaves together when the body returned, or this rank alone when it raised."""
    dist.init_process_group(backend, **init_kwargs)
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for rank 0's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
