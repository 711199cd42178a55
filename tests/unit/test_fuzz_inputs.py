"""Property-based tests (hypothesis): whatever a user or a broken disk hands autoplan, it
either loads as valid or fails with autoplan's own error, never another exception.

Random mutations (replace, delete or add a value anywhere in the tree, up to three at once)
of a good plan, a good profile and a good plan-cache entry; random bytes as a plan file;
random strings for the command line's --mesh, --axis-names and budget flags. Examples are
derandomized (the same ones every run) and counted in EXAMPLES.
"""

import argparse
import copy
import json
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import autoplan
from autoplan.cli.suggest import _positive_float
from autoplan.cost.profile import load_profile, profile_from_dict, profile_path
from autoplan.errors import MeshError, PlanError, ProfileError
from autoplan.model_file import parse_axis_names, parse_mesh
from autoplan.pipeline.cached import suggest_cached
from autoplan.pipeline.plan_cache import CacheKey, CacheWarning, PlanCache
from autoplan.plan.module_plan import Plan

EXAMPLES = {"plan": 300, "profile": 300, "cache": 150, "plan_bytes": 200, "mesh": 500, "axis_names": 500, "budget": 500}


def examples(name):
    return settings(
        max_examples=EXAMPLES[name], deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


placements = st.sampled_from(["R", "S(0)", "S(1)", "S(2)", "S(7)", "P(sum)", "P(avg)", "P(max)", "X", ""])
scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6) | placements
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6
)


def all_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from all_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from all_paths(value, (*prefix, index))


def mutate(data, doc):
    """``doc`` with one to three random edits drawn from ``data``."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(all_paths(doc))))
        if not path:
            return data.draw(json_values) if data.draw(st.booleans()) else doc
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(json_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=5))] = data.draw(json_values)
        else:
            parent.append(data.draw(json_values))
    return doc


@pytest.fixture(scope="module")
def good_plan():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        inputs = (torch.randn(4, 8),)
    return model, inputs, autoplan.suggest(model, inputs, mesh=(2, 2), cache=False, profile="cpu-gloo").to_dict()


@given(data=st.data())
@examples("plan")
def test_mutated_plan_loads_or_raises_plan_error(good_plan, data):
    doc = mutate(data, good_plan[2])
    try:
        plan = Plan.from_dict(doc, source="mutated.json")
    except PlanError as err:
        assert "\n" not in str(err) and "mutated.json" in str(err)
        return
    assert Plan.from_dict(plan.to_dict()).to_json() == plan.to_json()  # what loads, round-trips


def test_a_key_with_a_newline_is_named_on_one_line(good_plan):
    """Found by the fuzzing above: a module named "\n" whose layout is null."""
    doc = copy.deepcopy(good_plan[2])
    doc["modules"]["\n"] = None
    with pytest.raises(PlanError) as err:
        Plan.from_dict(doc, source="mutated.json")
    assert "\n" not in str(err.value) and 'modules."\\n"' in str(err.value)


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@examples("plan_bytes")
def test_any_bytes_as_a_plan_file_raise_plan_error(tmp_path, raw):
    path = tmp_path / "plan.json"
    path.write_bytes(raw)
    with pytest.raises(PlanError):
        Plan.load(path)


GOOD_PROFILE = json.loads(profile_path("cpu-gloo").read_text())


@given(data=st.data())
@examples("profile")
def test_mutated_profile_loads_or_raises_profile_error(data):
    doc = mutate(data, GOOD_PROFILE)
    try:
        profile = profile_from_dict(doc, source="mutated.json")
    except ProfileError as err:
        assert "\n" not in str(err) and "mutated.json" in str(err)
        return
    for figure in (profile.memory_bandwidth_bytes_per_s, *profile.peak_flops.values(), profile.matmul_efficiency.max):
        assert math.isfinite(figure) and figure > 0


@pytest.fixture(scope="module")
def cache_entry(good_plan, tmp_path_factory):
    model, inputs, _ = good_plan
    directory = tmp_path_factory.mktemp("cache")
    _, report = suggest_cached(model, inputs, (2, 2), ("dp", "tp"), profile="cpu-gloo", cache_dir=directory)
    path = directory / report.extra["cache_path"].rsplit("/", 1)[-1]
    return path, json.loads(path.read_text())


@given(data=st.data())
@examples("cache")
def test_mutated_cache_entry_is_served_valid_or_removed_with_one_warning(cache_entry, data):
    path, entry = cache_entry
    doc = mutate(data, entry)
    path.write_text(json.dumps(doc))
    cache = PlanCache(path.parent)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        found = cache.lookup(CacheKey(entry["key"], entry["fields"]))
    if found is None:
        assert [w.category for w in seen] == [CacheWarning] and "\n" not in str(seen[0].message)
        assert not path.exists()  # removed, so that the next run stores a good one
    else:
        assert not seen and found.plan.to_dict() == Plan.from_dict(doc["plan"]).to_dict()


@given(text=st.text(max_size=12) | st.from_regex(r"\A[0-9x ]{0,9}\Z"))
@examples("mesh")
def test_mesh_flag_parses_or_raises_mesh_error(text):
    try:
        mesh = parse_mesh(text)
    except MeshError as err:
        assert "\n" not in str(err)
        return
    assert mesh and all(isinstance(n, int) and n >= 1 for n in mesh)
    assert "x".join(map(str, mesh)) == "x".join(str(int(p)) for p in text.strip().split("x"))


@given(text=st.text(max_size=12) | st.from_regex(r"\A[a-z, ]{0,9}\Z"), axes=st.integers(1, 3))
@examples("axis_names")
def test_axis_names_flag_parses_or_raises_mesh_error(text, axes):
    try:
        names = parse_axis_names(text, (2,) * axes)
    except MeshError as err:
        assert "\n" not in str(err)
        return
    assert len(names) == axes == len(set(names)) and all(n.isidentifier() for n in names)


@given(text=st.text(max_size=10) | st.floats(allow_nan=True, allow_infinity=True).map(str))
@examples("budget")
def test_budget_flag_parses_or_raises_usage_error(text):
    try:
        value = _positive_float(text)
    except argparse.ArgumentTypeError as err:
        assert repr(text) in str(err)
        return
    assert math.isfinite(value) and value > 0


def test_shipped_profiles_and_schemas_agree():
    """Every shipped profile passes the schema, and the schema's op classes are the code's."""
    from autoplan.cost.op_classes import OP_CLASSES
    from autoplan.validation import schema_path

    schema = json.loads(schema_path("profile").read_text())
    assert schema["properties"]["dispatch"]["properties"]["op_classes"]["propertyNames"]["enum"] == list(OP_CLASSES)
    for name in ("a100-sxm", "cpu-gloo", "h100-sxm", "h100-sxm-calibrated"):
        load_profile(name)
