"""The plan cache (``autoplan/pipeline/plan_cache.py``): same question, same plan, no solve; a
changed question, or a damaged entry, plans again."""

import json
import logging
import warnings

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.cli import main
from autoplan.model_file import load_model_file
from autoplan.pipeline.cached import HIT, MISS, NOT_STORED, REPLACED, suggest_cached
from autoplan.pipeline.plan_cache import CacheWarning

MLP = str(EXAMPLES / "mlp.py")


def plan_mlp(cache_dir, **options):
    loaded = load_model_file(MLP)
    return suggest_cached(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), cache_dir=cache_dir, **options)


def test_second_call_reuses_the_plan_without_solving(tmp_path):
    first, report = plan_mlp(tmp_path)
    assert report.extra["cache"] == MISS and "solve" in report.stage_seconds
    second, report = plan_mlp(tmp_path)
    assert report.extra["cache"] == HIT
    assert set(report.stage_seconds) == {"trace", "cache lookup"}  # no choices, cost or solve stage
    assert second.to_json() == first.to_json()


def test_any_changed_option_is_another_entry(tmp_path):
    plan_mlp(tmp_path)
    for options in ({"memory_gb": 0.05}, {"profile": "cpu-gloo"}, {"time_limit_s": 30.0}):
        _, report = plan_mlp(tmp_path, **options)
        assert report.extra["cache"] == MISS, options
    loaded = load_model_file(MLP)
    _, report = suggest_cached(loaded.model, loaded.example_inputs, (2, 4), ("data", "model"), cache_dir=tmp_path)
    assert report.extra["cache"] == MISS
    _, report = suggest_cached(loaded.model, loaded.example_inputs, (4, 2), ("dp", "tp"), cache_dir=tmp_path)
    assert report.extra["cache"] == MISS
    assert len(list(tmp_path.glob("*.json"))) == 6


@pytest.mark.parametrize("damage", ["not json", "wrong key", "plan for another mesh", "parameters a list", "invalid placement"])
def test_damaged_entry_is_ignored_with_a_warning_and_replaced(tmp_path, damage):
    plan, report = plan_mlp(tmp_path)
    path = tmp_path / report.extra["cache_path"].rsplit("/", 1)[-1]
    entry = json.loads(path.read_text())
    if damage == "not json":
        path.write_text('{"cache_format": 1, "plan": ')
    elif damage == "wrong key":
        entry["key"] = "0" * 64
        path.write_text(json.dumps(entry))
    elif damage == "parameters a list":
        entry["plan"]["parameters"] = list(entry["plan"]["parameters"])
        path.write_text(json.dumps(entry))
    elif damage == "invalid placement":
        entry["plan"]["parameters"]["0.weight"] = ["S(9)", "R"]
        path.write_text(json.dumps(entry))
    else:
        entry["plan"]["mesh"]["shape"] = [8]
        entry["plan"]["mesh"]["axis_names"] = ["dp"]
        path.write_text(json.dumps(entry))
    with pytest.warns(CacheWarning, match="removed plan cache entry .*; planning again") as seen:
        again, report = plan_mlp(tmp_path)
    assert len(seen) == 1 and "\n" not in str(seen[0].message)
    assert report.extra["cache"] == REPLACED
    assert again.to_json() == plan.to_json()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, report = plan_mlp(tmp_path)  # the replaced entry is whole again
    assert report.extra["cache"] == HIT


class Outcomes(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.seen = []

    def emit(self, record):
        if hasattr(record, "autoplan_cache"):
            self.seen.append(record.autoplan_cache)


def test_bypass_neither_reads_nor_writes(tmp_path):
    loaded = load_model_file(MLP)
    logger, outcomes = logging.getLogger("autoplan"), Outcomes()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(outcomes)
    try:
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False, cache_dir=tmp_path)
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache_dir=tmp_path)
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache_dir=tmp_path)
    finally:
        logger.removeHandler(outcomes)
        logger.setLevel(level)
    assert outcomes.seen == ["off", "miss", "hit"]
    assert len(list(tmp_path.iterdir())) == 1


def test_cli_reports_the_hit_and_no_cache_solves(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "plan.json")
    assert main(["suggest", MLP, "--mesh", "2x4", "--out", out]) == 0
    assert "plan stored in the plan cache" in capsys.readouterr().out
    assert main(["suggest", MLP, "--mesh", "2x4", "--out", out]) == 0
    assert "plan reused from the plan cache" in capsys.readouterr().out
    assert main(["suggest", MLP, "--mesh", "2x4", "--out", out, "--no-cache"]) == 0
    printed = capsys.readouterr().out
    assert "plan cache" not in printed and "solve" in printed


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_plan(tmp_path):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    with pytest.warns(CacheWarning, match="could not store the plan in the plan cache .*; the plan is not cached"):
        plan, report = plan_mlp(blocked)
    assert report.extra["cache"] == NOT_STORED and plan.mesh_shape == (2, 4)
    loaded = load_model_file(MLP)
    with pytest.warns(CacheWarning):  # the API too: a plan, not an OSError
        api_plan = autoplan.suggest(loaded.model, loaded.example_inputs, (2, 4), cache_dir=blocked)
    assert api_plan.to_json() == plan.to_json()
    assert blocked.read_text() == "a file where the cache directory should be"
