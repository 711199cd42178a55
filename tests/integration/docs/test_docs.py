"""The documentation stays true: generated pages current, links resolving, the README short
and its Python example running as written."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_README_LINES = 220


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current():
    stale = [str(path.relative_to(ROOT)) for path in _generator().stale_pages()]
    assert stale == [], f"stale generated pages {stale}: run python docs/generate.py"


def test_check_names_each_stale_page(tmp_path, monkeypatch, capsys):
    generator = _generator()
    monkeypatch.setattr(generator, "DOCS", tmp_path)  # no page written there yet: all stale
    assert generator.main(["--check"]) == 1
    err = capsys.readouterr().err
    for name in ("cli.md", "plan-format.md", "profile-format.md", "coverage.md"):
        assert name in err
    assert not any(tmp_path.iterdir()), "--check must write nothing"
    generator.write_pages()
    assert generator.main(["--check"]) == 0


def test_generated_reference_names_every_subcommand_and_schema_field():
    import json

    sys.path.insert(0, str(ROOT))
    from autoplan.cli import COMMANDS

    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in COMMANDS:
        name = command.__name__.rsplit(".", 1)[-1]
        assert f"## autoplan {name}" in cli
    plan_page = (ROOT / "docs" / "reference" / "plan-format.md").read_text()
    for field in json.loads((ROOT / "autoplan" / "schemas" / "plan.schema.json").read_text())["properties"]:
        assert f"`{field}`" in plan_page


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_readme_keeps_swappable_commands():
    text = README.read_text()
    for marker in ("main-command", "test-command"):
        block = re.search(rf"<!-- {marker} -->\n```sh\n(.+?)\n```\n<!-- /{marker} -->", text, re.DOTALL)
        assert block, f"README.md: no ```sh block between <!-- {marker} --> and <!-- /{marker} -->"
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"<!-- test-command -->\n```sh\n(.+?)\n```", text, re.DOTALL).group(1).strip()
    assert test_command in ci, "the README's test command is not the one .ci/run runs"


def _markdown_files() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _without_code_blocks(path.read_text())
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    anchors |= set(re.findall(r'<a id="([^"]+)"></a>', text))
    return anchors


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _links(path: Path) -> list[str]:
    text = _without_code_blocks(path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code: `[S(0), R]` and the like are not links
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_relative_link_resolves():
    broken = []
    for path in _markdown_files():
        for target in _links(path):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where}: no such anchor")
    assert broken == [], "\n".join(broken)


def test_index_links_every_page():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in _links(index)}
    pages = {path.resolve() for path in (ROOT / "docs").rglob("*.md") if path != index}
    missing = sorted(str(path.relative_to(ROOT)) for path in pages - linked)
    assert missing == [], f"docs/README.md does not link {missing}"


def test_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [bad](#nothing) [gone](missing.md) `[S(0), R](x)`\n")
    assert _links(page) == ["#title", "#nothing", "missing.md"]
    assert "title" in _anchors(page) and "nothing" not in _anchors(page)


@pytest.mark.slow
def test_readme_python_example_runs_as_written(tmp_path):
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "README.md should hold one ```python example"
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOPLAN_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "predicted step" in result.stdout and "one step taken" in result.stdout, result.stdout
    sys.path.insert(0, str(ROOT))
    from autoplan import Plan

    plan = Plan.load(tmp_path / "plans_out" / "tiny-llama-2x4.json")
    assert plan.mesh_shape == (2, 4)
    sharded = [name for name, spec in plan.parameters.items() if any(p != "R" for p in spec)]
    assert sharded, "the example's budget should make the plan shard some weights"
