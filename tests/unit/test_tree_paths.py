"""The apply engine's fast argument walks give the keys and results torch's pytree gives."""

from collections import namedtuple

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path

from autoplan.tree_paths import map_keyed_leaves, tensor_leaves

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
