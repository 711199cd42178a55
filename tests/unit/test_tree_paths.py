"""The apply engine's fast argument walks give the keys and results torch's pytree gives."""

from collections import namedtuple

import pytest
import torch
from torch.utils._pytree import keystr, register_pytree_node, tree_flatten, tree_flatten_with_path, tree_unflatten

from autoplan.tree_paths import keyed_leaves, map_keyed_leaves, tensor_leaves

Pair = namedtuple("Pair", "cos sin")


def nested():
    x, y = torch.ones(2), torch.zeros(3)
    return ((x, None, [y, 3]), {"hidden_states": x, "mask": None, "pos": (y, {"k": 1.5})})


def test_keys_are_the_ones_keystr_gives():
    tree = nested()
    seen = []
    assert map_keyed_leaves(tree, lambda key, leaf: seen.append(key) or leaf) is tree  # nothing changed: same object
    assert seen == [keystr(path) for path, _ in tree_flatten_with_path(tree)[0]]


def test_only_changed_containers_are_rebuilt():
    tree = nested()
    out = map_keyed_leaves(tree, lambda key, leaf: leaf * 2 if key == "[1]['pos'][0]" else leaf)
    assert out is not tree and out[0] is tree[0] and out[1]["hidden_states"] is tree[1]["hidden_states"]
    assert torch.equal(out[1]["pos"][0], torch.zeros(3)) and out[1]["pos"][1] is tree[1]["pos"][1]
    assert type(out[1]["pos"]) is tuple and out[1]["mask"] is None


def test_other_containers_are_left_to_the_generic_path():
    tree = ((Pair(torch.ones(1), torch.ones(1)),), {})
    assert map_keyed_leaves(tree, lambda key, leaf: leaf) is None
    assert tensor_leaves(tree) is None


def test_tensor_leaves():
    tree = nested()
    expected = [leaf for _, leaf in tree_flatten_with_path(tree)[0] if isinstance(leaf, torch.Tensor)]
    found = tensor_leaves(tree)
    assert len(found) == len(expected) == 4 and all(a is b for a, b in zip(found, expected))
    assert tensor_leaves(((), [], {}, None, 3)) == []


def test_batch_paths_read_as_people_write_them():
    from autoplan.tree_paths import readable_path

    paths = [keystr(path) for path, _ in tree_flatten_with_path(nested())[0]]
    assert [readable_path(p) for p in paths] == [
        "args[0]", "args[1]", "args[2][0]", "args[2][1]", "hidden_states", "mask", "pos[0]", "pos[1].k",
    ]
    batch = ((), {"batch": {"input_ids": 1, "pixel values": 2}})
    assert [readable_path(keystr(p)) for p, _ in tree_flatten_with_path(batch)[0]] == [
        "batch.input_ids", "batch['pixel values']",
    ]
    assert readable_path("[1]['odd key']") == "kwargs['odd key']"
    assert readable_path("[0][1].pixel_values") == "args[1].pixel_values"  # a dataclass field
    for unchanged in ("", "[2]", "[0]", "not a path", "[0]['x']", "[1][0]"):
        assert readable_path(unchanged) == unchanged


def test_users_see_readable_batch_names(tmp_path, capsys):
    """``suggest``'s listing, ``show``'s batch table and ``score``'s mismatch name the
    batch inputs by name, and a pin may name them so; the plan keeps the key paths."""
    import pytest
    from conftest import EXAMPLES

    import autoplan
    from autoplan.cli import main
    from autoplan.errors import PlanError
    from autoplan.model_file import load_model_file

    llama, mlp = str(EXAMPLES / "llama.py"), str(EXAMPLES / "mlp.py")
    out = tmp_path / "mlp.json"
    assert main(["suggest", mlp, "--mesh", "2", "--verbose", "--no-cache", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "  args[0]  shape [64, 1024]" in printed and "[0][0]" not in printed
    plan = autoplan.Plan.load(out)
    assert list(plan.inputs) == ["[0][0]"]  # what apply_plan looks up
    assert main(["show", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "args[0]" in printed and "[0][0]" not in printed
    import dataclasses

    small = load_model_file(mlp)
    renamed = dataclasses.replace(plan, inputs={"[1]['x']": plan.inputs["[0][0]"]})
    with pytest.raises(PlanError, match=r"the plan's batch inputs \[x\] are not the model's \[args\[0\]\]"):
        autoplan.score(small.model, small.example_inputs, renamed)
    loaded = load_model_file(llama)
    from autoplan.pipeline.suggest import suggest_with_report

    pinned, _ = suggest_with_report(loaded.model, loaded.example_inputs, (2, 4), ("dp", "tp"), "cpu-gloo",
                                    pinned={"input_ids": ("S(0)", "S(1)")})
    assert pinned.inputs["[1]['input_ids']"].placements == ("S(0)", "S(1)")


class _KeylessOutput:
    """A container registered as a pytree node with a flatten function only, as diffusers
    registers its output dataclasses (``Transformer2DModelOutput``)."""

    def __init__(self, sample, extra):
        self.sample, self.extra = sample, extra


register_pytree_node(
    _KeylessOutput, lambda out: ([out.sample, out.extra], None), lambda children, _: _KeylessOutput(*children),
)


def test_keyed_leaves_match_torchs_paths_where_it_has_them():
    tree = (nested(), Pair(torch.ones(1), [torch.zeros(1), None]))
    assert keyed_leaves(tree) == [(keystr(path), leaf) for path, leaf in tree_flatten_with_path(tree)[0]]


def test_keyed_leaves_key_a_keyless_node_by_position():
    x, y = torch.ones(2), torch.zeros(2)
    tree = ({"out": _KeylessOutput(x, (y, 3))},)
    with pytest.raises(ValueError, match="flatten_with_keys_fn"):
        tree_flatten_with_path(tree)  # what the trace met on diffusers' outputs
    leaves = keyed_leaves(tree)
    assert [key for key, _ in leaves] == ["[0]['out'][0]", "[0]['out'][1][0]", "[0]['out'][1][1]"]
    assert [leaf for _, leaf in leaves] == tree_flatten(tree)[0]  # rebuilt with tree_flatten's spec
    rebuilt = tree_unflatten([leaf for _, leaf in leaves], tree_flatten(tree)[1])
    assert rebuilt[0]["out"].sample is x and rebuilt[0]["out"].extra[0] is y
