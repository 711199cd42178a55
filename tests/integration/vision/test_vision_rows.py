"""Rows of the vision coverage benchmark (``benchmarks/vision_coverage.py``), run as the
benchmark runs them (``hf_row.run_row`` with its compile stage): built tiny from their
library's constructors, planned with the default budget and with the forcing budget that
shards weights on both axes of 2x4, one fake-process-group step each with the predicted
collectives, and the forced plan's step compiled whole (aot_eager) to the eager loss. Planned as the
benchmark plans them: no process group up, so each plan is priced by a dry run of its step.
A row is skipped where its library does not import (CI installs none of them; timm and
open_clip import only beside a torchvision built for the running torch)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import hf_row
import vision_coverage
import vision_models

pytestmark = pytest.mark.slow  # each row plans twice and compiles


def _run(tmp_path: Path, source: str, name: str) -> dict:
    if not vision_models.installed(source):  # optional libraries: CI installs none of them
        pytest.skip(f"{source} does not import here (timm and open_clip also need a torchvision built for this torch)")
    model_file = tmp_path / "row.model.py"
    model_file.write_text(vision_models.model_file_text(source, name))
    row = {"task": source, "model_type": name, "class": vision_models.class_name(source, name)}
    return hf_row.run_row(row, model_file, ["float32"], numerics=False, numerics_max_step_s=0.0, out=tmp_path / "row.json",
                          more_stages=lambda rec, plans, mesh: vision_coverage.compile_stage(rec, plans, mesh, model_file),
                          plan_outside_group=True)


def _assert_passes(row: dict, known: tuple = ()) -> None:
    """Every stage passed, but for those in ``known`` (another part of the work: the
    prediction of collectives, ``nn.MultiheadAttention``); the compiled loss equals the
    eager one either way."""
    stages = row["stages"]
    failed = {name: info for name, info in stages.items() if not info["ok"] and name not in known}
    assert not failed, failed
    assert stages["plan float32/forced"]["sharded_every_axis"], stages["plan float32/forced"]
    assert stages["compile"]["rel_error"] <= vision_coverage.COMPILE_TOLERANCE, stages["compile"]


def test_diffusers_dit(tmp_path):
    _assert_passes(_run(tmp_path, "diffusers", "DiTTransformer2DModel"))


def test_x_transformers_encoder(tmp_path):
    _assert_passes(_run(tmp_path, "x_transformers", "encoder"))


def test_timm_swin(tmp_path):
    _assert_passes(_run(tmp_path, "timm", "swin_transformer"))


def test_open_clip_vit(tmp_path):
    """``nn.MultiheadAttention`` reads its ``out_proj`` parameters itself and unflattens its
    packed q/k/v projection by 3; the forced plan's step runs its prediction, and compiled."""
    row = _run(tmp_path, "open_clip", "ViT-B-16")
    _assert_passes(row)
    assert row["stages"]["compile"]["plan"] == "float32/forced"
