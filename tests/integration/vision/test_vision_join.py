"""``vision_coverage.py --join``: a run in parts (``--sources timm``, then the others) read as
one table, with the summary one run over every row would have printed."""

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import vision_coverage  # noqa: E402 - after the sys.path line above

RECORDED = ROOT / "docs" / "data" / "vision_coverage.json"


def _parts(tmp_path: Path) -> tuple[dict, list[Path]]:
    whole = json.loads(RECORDED.read_text())["result"]
    assert len(whole["rows"]) >= 2
    paths = []
    for i, rows in enumerate((whole["rows"][:1], whole["rows"][1:])):
        part = {**copy.deepcopy(whole), "rows": rows, "finished": True}
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part))
    return whole, paths


def test_joined_parts_summarize_as_the_whole_run(tmp_path):
    whole, parts = _parts(tmp_path)
    joined = vision_coverage.main(["--join", *map(str, parts), "--json", str(tmp_path / "joined.json")])
    assert [r["model_type"] for r in joined["rows"]] == [r["model_type"] for r in whole["rows"]]
    for key in ("built", "rows", "runs", "failures", "every_stage_passed"):
        assert joined["summary"][key] == whole["summary"][key], key
    assert json.loads((tmp_path / "joined.json").read_text())["compile_summary"] == joined["compile_summary"]
    assert any(line.startswith("every stage passed:") for line in joined["compile_summary"])


def test_a_row_in_two_parts_is_refused(tmp_path):
    _, parts = _parts(tmp_path)
    with pytest.raises(SystemExit, match="a row appears in two tables"):
        vision_coverage.main(["--join", str(parts[0]), str(parts[0]), "--json", str(tmp_path / "joined.json")])


def test_with_reruns_a_later_row_replaces_the_earlier_one(tmp_path):
    whole, parts = _parts(tmp_path)
    failed = copy.deepcopy(whole["rows"][0])
    failed["stages"]["compile"] = {"ok": False, "cause": "timeout after 900 s", "seconds": 900.0}
    first = {**copy.deepcopy(whole), "rows": [failed], "finished": True}
    parts[0].write_text(json.dumps(first))
    rerun = tmp_path / "rerun.json"
    rerun.write_text(json.dumps({**copy.deepcopy(whole), "rows": whole["rows"][:1], "finished": True}))
    joined = vision_coverage.main(["--join", str(parts[0]), str(parts[1]), str(rerun), "--reruns",
                                   "--json", str(tmp_path / "joined.json")])
    assert sorted(r["model_type"] for r in joined["rows"]) == sorted(r["model_type"] for r in whole["rows"])
    assert joined["summary"]["every_stage_passed"] == whole["summary"]["every_stage_passed"]
    name = f"{whole['rows'][0]['task']}:{whole['rows'][0]['model_type']}"
    assert joined["parts"][2]["replaced"] == [name]
    assert "replaced" not in joined["parts"][0]
