"""Must-show 1 (profiles): a corrupted or incomplete profile is refused with a clear message.

Every refusal is a ProfileError whose one line names the file, the exact key or problem,
and the fix. Also: every shipped preset loads, and the optional per-axis table is used
exactly when the planning mesh is the calibrated one.
"""

import copy
import json

import pytest

from autoplan.cost.comm import collective_seconds
from autoplan.cost.profile import COST_MODELS_DIR, load_profile, profile_from_dict
from autoplan.errors import ProfileError

GOOD = json.loads((COST_MODELS_DIR / "h100-sxm.json").read_text())


def write(tmp_path, data, name="broken.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def refused(path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert str(path) in message and "; fix: " in message
    assert "\n" not in message
    return message


def changed(edit):
    data = copy.deepcopy(GOOD)
    edit(data)
    return data


@pytest.mark.parametrize("name", sorted(p.stem for p in COST_MODELS_DIR.glob("*.json")))
def test_every_shipped_preset_loads(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.provenance.get("measured") in (True, False)


def test_good_copy_loads(tmp_path):
    assert load_profile(str(write(tmp_path, GOOD))).device_name == GOOD["device"]["name"]


@pytest.mark.parametrize("text", ["{not json", "", '{"schema_version": 1,', "\x00\xff\xfe binary"])
def test_corrupted_file_is_not_json(tmp_path, text):
    message = refused(write(tmp_path, text))
    assert "is not valid JSON" in message and "autoplan calibrate" in message


def test_top_level_must_be_an_object(tmp_path):
    message = refused(write(tmp_path, [1, 2, 3]))
    assert "expected a JSON object, got list" in message


@pytest.mark.parametrize(
    "path",
    [
        ("name",),
        ("device",),
        ("device", "memory_bytes"),
        ("device", "peak_flops"),
        ("efficiency", "matmul", "half_at_flops"),
        ("efficiency", "kernel_overhead_s"),
        ("links", "inter_node"),
        ("links", "intra_node", "all_to_all"),
        ("links", "inter_node", "reduce_scatter", "latency_s"),
        ("dispatch",),
        ("dispatch", "forward_op_s"),
        ("dispatch", "optimizer_bytes_per_s"),
        ("dispatch", "overlaps_device"),
    ],
)
def test_missing_key_is_named(tmp_path, path):
    def drop(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    message = refused(write(tmp_path, changed(drop)))
    assert f"lacks {'.'.join(path)}" in message
    assert "re-create it with `autoplan calibrate` or fix the file" in message


def test_missing_float32_peak(tmp_path):
    message = refused(write(tmp_path, changed(lambda d: d["device"]["peak_flops"].pop("float32"))))
    assert "lacks device.peak_flops.float32" in message and "add the float32 peak" in message


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (("links", "intra_node", "all_reduce", "bus_bandwidth_bytes_per_s"), -3.7e11, "a positive number"),
        (("links", "inter_node", "all_gather", "latency_s"), 0, "a positive number"),
        (("device", "memory_bandwidth_bytes_per_s"), "fast", "a finite number"),
        (("device", "peak_flops", "bfloat16"), True, "a finite number"),
        (("device", "memory_bytes"), float("nan"), "a finite number"),
        (("efficiency", "memory", "max"), float("inf"), "a finite number"),
        (("efficiency", "kernel_overhead_s"), -1e-6, "a number >= 0"),
        (("dispatch", "backward_op_s"), -1e-4, "a number >= 0"),
        (("dispatch", "optimizer_param_s"), "slow", "a finite number"),
        (("dispatch", "optimizer_bytes_per_s"), 0, "a positive number"),
        (("dispatch", "overlaps_device"), 1, "true or false"),
    ],
)
def test_bad_number_is_named(tmp_path, path, value, expected):
    def set_value(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    message = refused(write(tmp_path, changed(set_value)))
    assert f"expected {expected} at {'.'.join(path)}, got {value!r}" in message


@pytest.mark.parametrize("version", [3, 0, "2", None])
def test_wrong_schema_version(tmp_path, version):
    message = refused(write(tmp_path, changed(lambda d: d.update(schema_version=version))))
    assert f"has schema_version {version!r}, expected 2" in message
    assert "upgrade autoplan or re-create the profile" in message


def test_schema_1_profile_names_what_it_lacks_and_the_fix(tmp_path):
    """A profile written before the eager-execution costs existed is refused, not priced without them."""
    def downgrade(data):
        data["schema_version"] = 1
        del data["dispatch"]

    message = refused(write(tmp_path, changed(downgrade)))
    assert "has schema_version 1, expected 2: it lacks the eager-execution costs" in message
    assert "re-create it with `autoplan calibrate`" in message and '"dispatch" object as in cost_models/h100-sxm.json' in message


def test_section_of_the_wrong_type(tmp_path):
    message = refused(write(tmp_path, changed(lambda d: d.update(links=[1, 2]))))
    assert "expected an object at links, got [1, 2]" in message


def test_missing_profile_name_lists_the_presets():
    with pytest.raises(ProfileError, match=r"no cluster profile 'nope'.*fix: pass one of: .*h100-sxm"):
        load_profile("nope")


def axes_table(latency, bandwidth):
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    return {k: {"latency_s": latency, "bus_bandwidth_bytes_per_s": bandwidth} for k in kinds}


def with_axes(axes):
    return changed(lambda d: d.update(axes=axes))


@pytest.mark.parametrize(
    "axes,expected",
    [
        ({"2y4": []}, "expected a mesh shape like 2x4 as a key of axes, got '2y4'"),
        ({"2x4": [{"collectives": axes_table(1e-5, 1e9)}]}, "expected a list of 2 axes at axes.2x4"),
        ({"2x4": [{"collectives": axes_table(1e-5, 1e9)}, {"name": "tp"}]}, "lacks axes.2x4[1].collectives"),
        ({"8": [{"collectives": axes_table(1e-5, -1.0)}]}, "positive number at axes.8[0].collectives.all_reduce.bus_bandwidth_bytes_per_s"),
    ],
)
def test_bad_axes_table(tmp_path, axes, expected):
    assert expected in refused(write(tmp_path, with_axes(axes)))


def test_axes_table_is_used_only_on_its_mesh():
    profile = profile_from_dict(with_axes({"2x4": [{"name": "dp", "collectives": axes_table(1e-3, 1e9)},
                                                   {"name": "tp", "collectives": axes_table(2e-3, 2e9)}]}))
    nbytes = 8e6
    # On the calibrated 2x4 mesh each axis has its own measured cost ...
    assert collective_seconds(profile, "all_gather", nbytes, (2, 4), 0) == pytest.approx(1e-3 + 0.5 * nbytes / 1e9)
    assert collective_seconds(profile, "all_reduce", nbytes, (2, 4), 1) == pytest.approx(2e-3 + 1.5 * nbytes / 2e9)
    # ... any other mesh falls back to the link table (here intra-node: 8 devices per node).
    intra = GOOD["links"]["intra_node"]["all_reduce"]
    expected = intra["latency_s"] + 1.5 * nbytes / intra["bus_bandwidth_bytes_per_s"]
    assert collective_seconds(profile, "all_reduce", nbytes, (4, 2), 0) == pytest.approx(expected)
    assert collective_seconds(profile, "all_reduce", nbytes, (1, 4), 0) == 0.0  # one-device axis


CLASS_TABLE = {"view": {"forward_op_s": 2e-5, "backward_op_s": 3e-5}, "matmul": {"forward_op_s": 4e-5, "backward_op_s": 9e-5}}


def test_op_class_table_loads_and_classes_not_in_it_pay_the_generic_figures(tmp_path):
    profile = load_profile(str(write(tmp_path, changed(lambda d: d["dispatch"].update(op_classes=CLASS_TABLE)))))
    dispatch = profile.dispatch
    assert dispatch.fixed_seconds("view") == (2e-5, 3e-5)
    assert dispatch.fixed_seconds("matmul") == (4e-5, 9e-5)
    assert dispatch.fixed_seconds("norm") == (dispatch.forward_op_s, dispatch.backward_op_s)
    assert dispatch.fixed_seconds("generic") == (dispatch.forward_op_s, dispatch.backward_op_s)


def test_profile_without_op_class_table_prices_every_op_by_the_generic_figures():
    assert "op_classes" not in GOOD["dispatch"]
    dispatch = profile_from_dict(copy.deepcopy(GOOD)).dispatch
    assert dispatch.op_classes == {}
    assert dispatch.fixed_seconds("matmul") == (GOOD["dispatch"]["forward_op_s"], GOOD["dispatch"]["backward_op_s"])


@pytest.mark.parametrize(
    "table,expected",
    [
        ([1, 2], "expected an object at dispatch.op_classes, got [1, 2]"),
        ({"softmaxx": CLASS_TABLE["view"]}, "unknown op class 'softmaxx' at dispatch.op_classes, expected one of view, "),
        ({"view": 2e-5}, "expected an object at dispatch.op_classes.view, got 2e-05"),
        ({"view": {"forward_op_s": 2e-5}}, "lacks dispatch.op_classes.view.backward_op_s"),
        ({"matmul": {"forward_op_s": -1.0, "backward_op_s": 0.0}}, "expected a number >= 0 at dispatch.op_classes.matmul.forward_op_s"),
        ({"matmul": {"forward_op_s": 1e-5, "backward_op_s": "slow"}},
            "expected a finite number at dispatch.op_classes.matmul.backward_op_s"),
    ],
)
def test_corrupt_op_class_table_is_refused_naming_the_key(tmp_path, table, expected):
    message = refused(write(tmp_path, changed(lambda d: d["dispatch"].update(op_classes=table))))
    assert expected in message
    assert "autoplan calibrate" in message
