"""Must-show 1 (calibrate): an end-to-end run on gloo processes writes a valid profile; an
interrupted run (a failing rank, a rank stopped mid-write) leaves no profile file; bad
input fails in seconds with one line naming the problem and the fix, writing nothing.
"""

import os
import signal

import pytest

from autoplan.calibrate.launch import CalibrateConfig, _sigterm_as_exit, spawn_calibration, spawned_rank, write_profile
from autoplan.cli import main
from autoplan.cost.comm import collective_seconds
from autoplan.cost.op_classes import OP_CLASSES
from autoplan.cost.profile import COLLECTIVES, load_profile
from autoplan.errors import AutoplanError


@pytest.mark.gloo
def test_quick_run_on_four_gloo_processes_writes_a_loadable_profile(tmp_path, capfd):
    out = tmp_path / "profiles" / "quick-2x2.json"
    argv = ["calibrate", "--spawn", "4", "--mesh", "2x2", "--axis-names", "dp,tp", "--backend", "gloo", "--quick"]
    status = main([*argv, "--out", str(out)])
    captured = capfd.readouterr()  # capfd: the progress bar comes from the spawned rank 0
    assert status == 0, captured.err
    assert sorted(p.name for p in out.parent.iterdir()) == ["quick-2x2.json"]  # no temp file left
    assert "calibrate [" in captured.err and "] 66/66" in captured.err  # the progress bar, to the end
    assert f"profile written to {out}" in captured.out

    profile = load_profile(str(out))
    prov = profile.provenance
    assert profile.name == "quick-2x2" and profile.devices_per_node == 4
    assert prov["measured"] is True and prov["quick"] is True
    assert prov["backend"] == "gloo" and prov["mesh"] == [2, 2] and prov["axis_names"] == ["dp", "tp"]
    assert prov["threads_per_rank"] == int(os.environ.get("OMP_NUM_THREADS", "1"))
    assert prov["versions"]["torch"] and "nccl" in prov["versions"] and prov["date"].endswith("+00:00")
    assert len(prov["hosts_sha256"]) == 1 and len(prov["hosts_sha256"][0]) == 12
    assert prov["sweep"]["message_bytes"] == [4096, 65536, 1048576]
    assert set(prov["fits"]["axes"]) == {"dp", "tp"}
    for per_kind in prov["fits"]["axes"].values():
        assert set(per_kind) == set(COLLECTIVES)
        assert all(fit["rel_rms"] >= 0 and fit["samples"] == 3 for fit in per_kind.values())
    # Launch-bound timings (under 2x the per-op overhead) may be left out of the compute fits.
    assert 2 <= prov["fits"]["matmul"]["samples"] <= 3 and 2 <= prov["fits"]["memory"]["samples"] <= 6
    assert len(prov["measurements"]["matmul"]) == 3 and len(prov["measurements"]["memory"]) == 6
    assert "copied from intra_node" in prov["links"]["inter_node"]
    assert profile.peak_flops.keys() == {"float32"}

    # Eager DTensor costs measured on the mesh. Not asserted: an order between them. With 4
    # ranks on 2 cores the quick sweep's tiny timings are mostly time spent descheduled: one CI
    # run measured the plain one-element add at 41 us against 34 us per DTensor op, another
    # AdamW's fixed cost per parameter (about seven DTensor ops without autograd, fitted
    # through two sizes) at 135 us against 148 us per recorded forward op under plan_execution.
    dispatch = profile.dispatch
    assert dispatch.forward_op_s > 0 and profile.kernel_overhead_s > 0
    assert dispatch.optimizer_param_s > 0 and dispatch.optimizer_bytes_per_s > 0
    assert dispatch.backward_op_s > 0 and not dispatch.overlaps_device
    assert len(prov["measurements"]["optimizer"]) == 2 and prov["fits"]["optimizer"]["samples"] == 2
    # Every op class is priced by its own representative ops, each timed on the mesh.
    assert set(dispatch.op_classes) == set(OP_CLASSES)
    assert all(cost.forward_op_s > 0 and cost.backward_op_s >= 0 for cost in dispatch.op_classes.values())
    raw = prov["measurements"]["dtensor_op_classes"]
    assert {row[0] for row in raw} == set(OP_CLASSES) and all(row[2] > 0 for row in raw)

    # The planner prices collectives on the calibrated mesh from the per-axis table.
    assert set(profile.axes) == {(2, 2)}
    dp_all_reduce = profile.axes[(2, 2)][0]["all_reduce"]
    expected = dp_all_reduce.latency_s + 1.0 * 1e6 / dp_all_reduce.bus_bandwidth_bytes_per_s
    assert collective_seconds(profile, "all_reduce", 1e6, (2, 2), 0) == pytest.approx(expected)


@pytest.mark.gloo
def test_one_device_run_measures_compute_and_takes_the_links_from_a_profile(tmp_path, capfd):
    """A machine with one device (a single-GPU box) measures compute and eager costs; the
    links and devices per node come from the named profile, and the profile says so."""
    out = tmp_path / "one.json"
    argv = ["calibrate", "--spawn", "1", "--mesh", "1", "--links-from", "h100-sxm", "--backend", "gloo", "--quick"]
    status = main([*argv, "--out", str(out)])
    captured = capfd.readouterr()
    assert status == 0, captured.err
    assert "links and devices per node from profile h100-sxm" in captured.out

    profile, preset = load_profile(str(out)), load_profile("h100-sxm")
    assert profile.links == preset.links and profile.devices_per_node == preset.devices_per_node == 8
    assert profile.axes == {}  # no axis was measured
    prov = profile.provenance
    assert prov["links_from"] == "h100-sxm" and prov["mesh"] == [1] and prov["fits"]["axes"] == {}
    assert prov["links"] == dict.fromkeys(("intra_node", "inter_node"), "copied from profile 'h100-sxm'")
    assert any("published figures, not measured" in note for note in prov["notes"])
    assert prov["measurements"]["collectives"] == {}
    # What was measured is this device's, not the preset's.
    assert profile.device_name != preset.device_name and profile.dispatch.forward_op_s > 0
    assert len(prov["measurements"]["matmul"]) == 3 and profile.peak_flops.keys() == {"float32"}


def test_links_from_is_for_a_one_device_run(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "4", "--mesh", "2x2", "--links-from", "h100-sxm"])
    assert "--links-from is for a one-device run" in line and "--mesh 1" in line


def test_links_from_an_unknown_profile(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "1", "--mesh", "1", "--links-from", "no-such-cluster"])
    assert "no cluster profile 'no-such-cluster'" in line and "h100-sxm" in line


def rank_that_fails(rank, config, world_size, port):
    """A spawned rank; rank 1 dies in the middle of the sweep (after its collectives)."""
    if rank == 1:
        import autoplan.calibrate.sweep as sweep

        def lose_device(*args):
            raise RuntimeError("rank 1 lost its device")

        sweep.measure_matmuls = lose_device
    spawned_rank(rank, config, world_size, port)


@pytest.mark.gloo
def test_a_failing_rank_leaves_no_profile(tmp_path):
    out = tmp_path / "failed.json"
    config = CalibrateConfig((2,), ("dp",), str(out), "gloo", quick=True)
    with pytest.raises(AutoplanError, match=r"calibration failed on rank [01]: .*; no profile was written") as info:
        spawn_calibration(config, 2, rank_main=rank_that_fails)
    assert info.value.hint == "rerun with --debug for the rank's traceback"
    assert list(tmp_path.iterdir()) == []


def test_a_rank_stopped_mid_write_leaves_no_file(tmp_path, monkeypatch):
    """torchrun or the spawner stops a rank with SIGTERM: the half-written temp file goes too."""
    out = tmp_path / "stopped.json"

    def stopped_while_writing(fd):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "fsync", stopped_while_writing)
    with pytest.raises(SystemExit), _sigterm_as_exit():
        write_profile(str(out), {"schema_version": 1, "name": "x" * 100_000})
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_ctrl_c_during_the_write_leaves_no_file(tmp_path, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(str(tmp_path / "p.json"), {"schema_version": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def failing(tmp_path, capsys, argv, out=None):
    out = out or tmp_path / "out" / "profile.json"
    status = main(["calibrate", *argv, "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoplan: error:") and "; fix: " in lines[0], captured.err
    assert not (tmp_path / "out").exists()
    return lines[0]


@pytest.mark.parametrize("mesh", ["2x", "0x4", "2*4"])
def test_malformed_mesh(tmp_path, capsys, mesh):
    assert "--mesh 2x4" in failing(tmp_path, capsys, ["--spawn", "8", "--mesh", mesh])


def test_mesh_without_an_axis_to_measure(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "1", "--mesh", "1x1"])
    assert "no axis with more than one device" in line and "--links-from" in line


def test_axis_names_must_match_the_mesh(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "8", "--mesh", "2x4", "--axis-names", "dp"])
    assert "1 axis names" in line and "--axis-names dp,tp" in line


def test_spawn_count_must_match_the_mesh(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "3", "--mesh", "2x2"])
    assert "mesh 2x2 needs 4 processes, got --spawn 3" in line


def test_torchrun_world_size_must_match_the_mesh(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    line = failing(tmp_path, capsys, ["--mesh", "2x4", "--backend", "gloo"])
    assert "mesh 2x4 needs 8 processes, got WORLD_SIZE=4" in line and "multiply to 4" in line


def test_needs_torchrun_or_spawn(tmp_path, capsys, no_torchrun):
    line = failing(tmp_path, capsys, ["--mesh", "2x4", "--backend", "gloo"])
    assert "torchrun --nproc-per-node N -m autoplan calibrate --mesh 2x4" in line and "--spawn N" in line


def test_out_under_a_file_is_refused_before_measuring(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = failing(tmp_path, capsys, ["--spawn", "4", "--mesh", "2x2"], out=blocker / "p.json")
    assert "is not a directory" in line and "writable --out" in line


def test_out_that_is_a_directory_is_refused(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "4", "--mesh", "2x2"], out=tmp_path)
    assert "is a directory" in line


def test_out_must_be_json(tmp_path, capsys):
    line = failing(tmp_path, capsys, ["--spawn", "4", "--mesh", "2x2"], out=tmp_path / "profile.txt")
    assert "does not end in .json" in line


def test_nccl_without_gpus(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = failing(tmp_path, capsys, ["--spawn", "4", "--mesh", "2x2", "--backend", "nccl"])
    assert "--backend nccl needs CUDA GPUs" in line and "--backend gloo" in line
