"""``explain`` on a model whose output head is tied to its embedding: one block for the
one weight, naming both modules, instead of two blocks giving identical rows
(``explain/alternatives.py``'s ``units_of``)."""

import pytest
from conftest import EXAMPLES

import autoplan
from autoplan.explain.alternatives import units_of
from autoplan.explain.explain import explain_plan, explain_sections
from autoplan.model_file import load_model_file

TRANSFORMER = str(EXAMPLES / "transformer.py")  # output.weight is tok_embeddings.weight


@pytest.fixture(scope="module")
def tied_plan():
    loaded = load_model_file(TRANSFORMER)
    plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), cache=False, broadcast=False)
    assert plan.tied_parameters == {"output.weight": "tok_embeddings.weight"}
    return loaded, plan


def test_tied_modules_are_one_block_naming_both(tied_plan):
    _, plan = tied_plan
    units = {u.name: u.parameters for u in units_of(plan)}
    assert units["tok_embeddings (tied with output)"] == ("tok_embeddings.weight",)
    assert not [name for name in units if name.startswith("output")]
    # asked for one of them, it says which other module holds the same weight
    assert [u.name for u in units_of(plan, "output")] == ["output (tied with tok_embeddings)"]
    assert [u.name for u in units_of(plan, "tok_embeddings")] == ["tok_embeddings (tied with output)"]
    assert [u.name for u in units_of(plan, "norm")] == ["norm"]


@pytest.mark.slow
def test_explain_shows_no_repeated_rows_for_a_tied_weight(tied_plan):
    loaded, plan = tied_plan
    result = explain_plan(loaded.model, loaded.example_inputs, plan)
    blocks = {a.unit for a in result.alternatives}
    assert "tok_embeddings (tied with output)" in blocks and not {b for b in blocks if b.startswith("output")}
    rows = [(a.name, a.step_time_s, a.peak_memory_bytes) for a in result.alternatives if a.unit.startswith("tok_embeddings")]
    assert len(rows) == len(set(rows)) >= 2
    table = next(s for s in explain_sections(result) if s.title.startswith("alternatives per block"))
    assert all(not row[0].startswith("output") for row in table.rows)
