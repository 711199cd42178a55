"""The package layout is the pipeline: each stage imports only the stages before it.

Stages in order: trace, choices, cost, solve, plan, apply, verify. Below them all sit the
shared modules at the top of ``autoplan/`` and ``autoplan/dtensor`` (everything that
reaches into DTensor); above them the pipeline, the evaluation of plans, their explanation
(show, diff, explain, report), interop, calibrate and the command line. Checked on the source (every ``import`` statement,
function-level ones included) and, for the apply engine and verify, on what a fresh
interpreter really loads.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "autoplan"  # tests/unit/ -> the checkout
STAGES = ("trace", "choices", "cost", "solve", "plan", "apply", "verify")
BELOW_STAGES = ("<shared>", "dtensor")
ABOVE_STAGES = ("pipeline", "pipeline_parallel", "evaluate", "explain", "interop", "calibrate", "cli")


def _layer(module: str) -> str:
    """``autoplan.cost.comm`` -> ``cost``; a top-level module -> ``<shared>``."""
    parts = module.split(".")
    if parts[1] == "__main__":
        return "<entry>"
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return "<shared>"
    return parts[1]


def _imports(path: Path) -> set[str]:
    module = "autoplan." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autoplan."):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if (PACKAGE / node.module.split(".", 1)[1].replace(".", "/") / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("autoplan."))
    return {m for m in found if m != module}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue
        yield "autoplan." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"), path


def _allowed(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    if importer in BELOW_STAGES:
        return imported in BELOW_STAGES[: BELOW_STAGES.index(importer) + 1]
    if importer in STAGES:
        earlier = STAGES[: STAGES.index(importer)]
        return imported in BELOW_STAGES or imported in earlier
    if importer == "cli" or importer == "<entry>":
        return True
    return imported != "cli"  # the layers above the stages use anything but the command line


def test_every_stage_imports_only_earlier_stages():
    wrong = []
    for module, path in _modules():
        importer = _layer(module)
        for imported in sorted(_imports(path)):
            if not _allowed(importer, _layer(imported)):
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_layers_are_the_folders():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(STAGES) | {"dtensor"} | set(ABOVE_STAGES)


@pytest.mark.slow  # a fresh interpreter per entry point
@pytest.mark.parametrize("entry", ["autoplan.apply.engine", "autoplan.verify.step_check"])
def test_apply_and_verify_load_nothing_from_cost_or_solve(entry):
    code = f"import sys, json, {entry}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('autoplan.'))))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert [m for m in loaded if _layer(m) in ("cost", "solve")] == []
