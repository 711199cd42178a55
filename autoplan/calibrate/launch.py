"""Running a calibration: every rank under torchrun, or N ranks spawned here (``--spawn N``).

Every rank runs the same sweep on the real device mesh. Rank 0 alone fits, builds and
writes the profile, and only once every rank has finished measuring (the cluster-info
gather and a final barrier stand between the sweep and the write). The write is atomic and
is preceded by ``profile_from_dict`` on the very data, so the file that appears is always
a whole profile that loads.

An interrupted run leaves no profile: Ctrl-C stops every rank; a launcher killed outright
(``kill -9``) takes its ranks with it (``_processes.die_with_parent``: torchrun's agent or
``--spawn``'s process), and rank 0 checks its launcher is alive right before writing; a crashed rank breaks its
peers' next collective (gloo and NCCL both raise), and torchrun or the spawner then stops
the rest with SIGTERM. Only during the write does rank 0 turn SIGTERM into SystemExit, so
that ``write_atomic`` removes its temp file instead of dying mid-way; elsewhere SIGTERM
keeps its default (a rank blocked in a collective or the rendezvous, where a Python
handler could not run, dies at once instead of waiting for SIGKILL).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from autoplan._files import check_outputs, write_atomic
from autoplan._process_group import free_port, process_group
from autoplan._processes import die_with_parent, parent_alive
from autoplan.calibrate.host import gather_cluster_info, versions
from autoplan.calibrate.profile_writer import LinksSource, RunInfo, build_profile
from autoplan.calibrate.progress import Progress
from autoplan.calibrate.sizes import sweep_for
from autoplan.calibrate.sweep import count_points, measure_all
from autoplan.calibrate.timing import Timer
from autoplan.cost.profile import profile_from_dict
from autoplan.errors import AutoplanError

PROCESS_GROUP_TIMEOUT = timedelta(minutes=5)
"""A rank that hangs (rather than dies) fails its peers' collectives after this long.
The slowest single op of a full CPU sweep takes about a second."""


@dataclass(frozen=True, slots=True)
class CalibrateConfig:
    """One calibration run, as the command line asked for it."""

    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    out: str
    """Profile file rank 0 writes; its stem is the profile's name."""
    backend: str
    """"gloo" (CPU) or "nccl" (one GPU per rank)."""
    quick: bool
    """A small sweep, for tests."""
    links_from: LinksSource | None = None
    """For a one-device mesh: the profile whose links and devices per node are copied."""

    @property
    def world_size(self) -> int:
        return math.prod(self.mesh_shape)


def calibrate_rank(
    config: CalibrateConfig, rank: int, world_size: int, init_method: str = "env://", local_rank: int = 0
) -> dict | None:
    """One rank's share of a calibration; rank 0 writes the profile and returns its data."""
    device = _device(config.backend, local_rank)
    with process_group(
        config.backend, init_method=init_method, rank=rank, world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT
    ):
        return _measure_and_write(config, device, rank)


def spawn_calibration(config: CalibrateConfig, nprocs: int, rank_main=None) -> None:
    """Start ``nprocs`` ranks on this host (127.0.0.1) and wait; any rank's failure raises.

    ``rank_main(rank, config, world_size, port)`` is what each rank runs (default
    ``spawned_rank``); tests pass one that fails on purpose. It must be importable by name:
    ranks are fresh interpreters.
    """
    import torch.multiprocessing as mp

    port = free_port()
    context = mp.start_processes(
        _rank_entry, args=(rank_main or spawned_rank, config, nprocs, port, os.getpid()),
        nprocs=nprocs, join=False, start_method="spawn",
    )
    try:
        while not context.join():
            pass
    except mp.ProcessRaisedException as err:
        raise AutoplanError(
            f"calibration failed on rank {err.error_index}: {_last_line(str(err))}; no profile was written",
            "rerun with --debug for the rank's traceback",
        ) from err
    except mp.ProcessExitedException as err:
        raise AutoplanError(
            f"calibration rank {err.error_index} died (exit code {err.exit_code}); no profile was written",
            "check the machine's memory and rerun",
        ) from err
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join()


def check_out_path(out: str, links_from: str | None = None) -> None:
    """Fail before measuring if ``out`` cannot be written or is the --links-from profile
    (a sweep takes minutes)."""
    check_outputs({"--out": out}, {"the --links-from profile": links_from})
    if Path(out).suffix != ".json":
        raise AutoplanError(f"--out {out} does not end in .json", "pass a path like cost_models/mycluster.json")


def write_profile(out: str, data: dict) -> None:
    try:
        write_atomic(out, to_json(data))
    except OSError as err:
        raise AutoplanError(
            f"could not write the profile to {out}: {err.strerror or err}", "pass a writable --out path"
        ) from err


def to_json(data, indent: int = 0) -> str:
    """JSON with one key a line, and flat objects and lists (a fit, a timing) on one line."""
    pad = "  " * indent
    nested = isinstance(data, (dict, list)) and any(
        isinstance(item, (dict, list)) for item in (data.values() if isinstance(data, dict) else data)
    )
    if nested and isinstance(data, dict):
        items = [f"{pad}  {json.dumps(str(key))}: {to_json(value, indent + 1).lstrip()}" for key, value in data.items()]
        text = pad + "{\n" + ",\n".join(items) + f"\n{pad}}}"
    elif nested:
        text = pad + "[\n" + ",\n".join(to_json(item, indent + 1) for item in data) + f"\n{pad}]"
    else:
        text = pad + json.dumps(data, separators=(", ", ": "))
    return text + "\n" if indent == 0 else text


def _measure_and_write(config: CalibrateConfig, device: torch.device, rank: int) -> dict | None:
    start = time.perf_counter()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, config.mesh_shape, mesh_dim_names=config.axis_names)
    sweep = sweep_for(device.type, config.quick)
    timer = Timer(device, sweep)
    progress = Progress(count_points(config.mesh_shape, sweep), enabled=rank == 0)
    measured = measure_all(mesh, sweep, timer, progress)
    cluster = gather_cluster_info(device)
    timer.agree_max([0.0])  # every rank has measured: only now may rank 0 write
    if rank != 0:
        return None
    run = RunInfo(
        name=Path(config.out).stem,
        mesh_shape=config.mesh_shape,
        axis_names=config.axis_names,
        backend=config.backend,
        device_type=device.type,
        sweep=sweep,
        quick=config.quick,
        threads_per_rank=torch.get_num_threads(),
        wall_time_s=time.perf_counter() - start,
        versions=versions(),
        links_from=config.links_from,
    )
    data = build_profile(run, measured, cluster)
    profile_from_dict(data, source=config.out)  # never write a profile that would not load
    if not parent_alive():  # the launcher was killed: the run is over, write nothing
        raise AutoplanError("the calibration's launcher is gone; no profile was written")
    with _sigterm_as_exit():
        write_profile(config.out, data)
    return data


def _device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _rank_entry(rank: int, rank_main, config: CalibrateConfig, world_size: int, port: int, launcher_pid: int) -> None:
    """A spawned rank dies with its launcher, whatever kills the launcher (``_processes.py``)."""
    die_with_parent(launcher_pid)
    rank_main(rank, config, world_size, port)


def spawned_rank(rank: int, config: CalibrateConfig, world_size: int, port: int) -> None:
    """One rank of ``spawn_calibration``: a gloo (or NCCL) process on 127.0.0.1."""
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does for several processes per host: one intra-op thread per rank,
        # so that ranks sharing cores do not also oversubscribe them with their threads.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    calibrate_rank(config, rank, world_size, f"tcp://127.0.0.1:{port}", local_rank=rank)


@contextmanager
def _sigterm_as_exit():
    """SIGTERM (torchrun or the spawner stopping a failed run) raises SystemExit here, so
    that ``write_atomic`` removes its temp file."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"
