"""``autoplan.suggest`` called on every rank of a torchrun job (8 gloo
processes) returns the same plan bytes on every rank, planned once on rank 0, and a second
launch takes the plan from the cache in ``plans_out/cache/`` without solving.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

from autoplan.plan.module_plan import Plan

WORLD = 8
SCRIPT = ROOT / "tests" / "scripts" / "suggest_every_rank.py"


def torchrun(workdir: Path, out: Path) -> list[dict]:
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_CACHE_DIR"}  # the default cache dir
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
        str(SCRIPT), str(EXAMPLES / "mlp.py"), str(out),
    ]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.gloo
def test_every_rank_gets_rank_zeros_plan_and_the_second_launch_hits_the_cache(tmp_path):
    first = torchrun(tmp_path, tmp_path / "first")
    entries = list((tmp_path / "plans_out" / "cache").glob("*.json"))
    assert len(entries) == 1, entries
    entry = entries[0]
    cached_plan = Plan.from_dict(json.loads(entry.read_text())["plan"]).to_json()
    digest = hashlib.sha256(cached_plan.encode()).hexdigest()
    assert {r["plan_sha256"] for r in first} == {digest}
    assert all(r["cache"] == ["miss"] for r in first), first  # rank 0 solved and stored, once
    written = entry.stat().st_mtime_ns, entry.read_bytes()

    second = torchrun(tmp_path, tmp_path / "second")
    assert {r["plan_sha256"] for r in second} == {digest}
    assert all(r["cache"] == ["hit"] for r in second), second  # no solve on any rank
    assert (entry.stat().st_mtime_ns, entry.read_bytes()) == written
    assert list((tmp_path / "plans_out" / "cache").glob("*.json")) == [entry]


def _fail_on_rank_zero(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from autoplan._process_group import process_group
    from autoplan.errors import InfeasibleError
    from autoplan.pipeline.rank_sync import RankZeroError, run_on_rank_zero

    with process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2):
        assert run_on_rank_zero(lambda: f"made on rank {dist.get_rank()}") == "made on rank 0"

        def produce():
            raise InfeasibleError("no plan fits 0.001 GiB per device", hint="raise --memory-gb")

        try:
            run_on_rank_zero(produce)
        except (InfeasibleError, RankZeroError) as err:
            (Path(out) / f"rank{rank}.txt").write_text(f"{type(err).__name__}: {err}")


@pytest.mark.gloo
def test_an_error_on_rank_zero_is_raised_on_every_rank(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_fail_on_rank_zero, args=(port, str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "rank0.txt").read_text().startswith("InfeasibleError: no plan fits")
    other = (tmp_path / "rank1.txt").read_text()
    assert other.startswith("RankZeroError: planning failed on rank 0: InfeasibleError: no plan fits 0.001 GiB")
    assert "raise --memory-gb" in other
