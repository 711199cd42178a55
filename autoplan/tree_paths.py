"""Fast walks over the arguments of module calls and torch functions, keyed as plans key them.

A plan names a module's inputs and outputs by pytree path (``keystr``: ``[0][1]``,
``[1]['hidden_states']``), and the apply engine looks them up on every module call, and
inspects the operands of every torch function a planned forward runs. torch's generic
pytree (``tree_flatten_with_path``, then ``keystr`` per leaf) costs tens of microseconds
per call, which on a small model added about a third to the forward. Almost every call
holds only tuples, lists and dicts, so these walks handle those directly, with the keys
``keystr`` would give, and return ``None`` for anything else (a named tuple, a
``ModelOutput``, a registered dataclass), where the caller takes the generic path.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable

import torch
from torch.utils._pytree import SUPPORTED_NODES, SequenceKey, keystr, tree_is_leaf


class _Unsupported(Exception):
    """A container other than tuple, list or dict: the generic pytree path must handle it."""


def map_keyed_leaves(tree, fn: Callable[[str, object], object]):
    """``tree`` with each leaf replaced by ``fn(key, leaf)``, the containers rebuilt only
    where a leaf changed (``fn`` returns the leaf itself to keep it); ``None`` where the
    tree holds a container this walk does not handle."""
    try:
        return _map(tree, fn, "")[0]
    except _Unsupported:
        return None


def _map(tree, fn, key: str) -> tuple[object, bool]:
    """(the mapped tree, whether any leaf changed). The flag, not ``new is old`` on the
    containers, says what to rebuild: dynamo traces these walks inside compiled hooks and
    cannot compare tuples by identity."""
    kind = type(tree)
    if kind is tuple or kind is list:
        mapped = [_map(item, fn, f"{key}[{index}]") for index, item in enumerate(tree)]
        if not any(changed for _, changed in mapped):
            return tree, False
        return kind(item for item, _ in mapped), True
    if kind is dict:
        mapped_items = {name: _map(item, fn, f"{key}[{name!r}]") for name, item in tree.items()}
        if not any(changed for _, changed in mapped_items.values()):
            return tree, False
        return {name: item for name, (item, _) in mapped_items.items()}, True
    if kind not in _ATOMS and not isinstance(tree, torch.Tensor) and not tree_is_leaf(tree):
        raise _Unsupported
    new = fn(key, tree)
    return new, new is not tree


def tensor_leaves(tree) -> list | None:
    """The tensors among ``tree``'s leaves, in order, those in the fields of dataclasses
    pytree does not know included; ``None`` where the tree holds a container this walk
    does not handle."""
    found: list = []
    try:
        _collect_tensors((tree,), found)
    except _Unsupported:
        return None
    return found


def _collect_tensors(items, found: list) -> None:
    for item in items.values() if type(items) is dict else items:
        kind = type(item)
        if kind in _ATOMS:
            continue
        if kind is tuple or kind is list or kind is dict:
            _collect_tensors(item, found)
        elif isinstance(item, torch.Tensor):
            found.append(item)
        elif not tree_is_leaf(item):
            raise _Unsupported
        elif hasattr(kind, "__dataclass_fields__"):
            # A dataclass pytree does not know (a model's output type) is one of its leaves,
            # but its tensors are the output's: the backward must see them.
            _collect_tensors([getattr(item, f.name) for f in dataclasses.fields(item)], found)


def keyed_leaves(tree) -> list[tuple[str, object]]:
    """Every leaf of ``tree`` with its path as ``keystr`` writes it (``tree_flatten_with_path``'s
    order and keys), also through containers registered as pytree nodes without keys:
    diffusers registers its output dataclasses with a flatten function only, which torch's
    walk with paths refuses ("Did not find a flatten_with_keys_fn"). Their children are
    keyed by position (``[0]``, ``[1]``), in the order ``tree_flatten`` gives them, so the
    leaves line up with ``tree_flatten``'s and rebuild with its spec."""
    found: list[tuple[str, object]] = []
    _walk_keyed(tree, "", found)
    return found


def _walk_keyed(tree, key: str, found: list) -> None:
    if tree_is_leaf(tree):
        found.append((key, tree))
        return
    node = SUPPORTED_NODES[_node_type(tree)]
    if node.flatten_with_keys_fn is not None:
        children = node.flatten_with_keys_fn(tree)[0]
        for child_key, child in children:
            _walk_keyed(child, key + keystr((child_key,)), found)
        return
    for index, child in enumerate(node.flatten_fn(tree)[0]):
        _walk_keyed(child, key + keystr((SequenceKey(index),)), found)


def _node_type(tree) -> type:
    """The pytree node type of a container: named tuples and structseqs have their own
    entries in torch's registry, under a shared type."""
    from torch.utils._pytree import _get_node_type  # private: the one place pytree says it

    return _get_node_type(tree)


_ATOMS = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
"""Types that are pytree leaves, checked first: ``tree_is_leaf`` costs a few microseconds."""


_KEY = re.compile(r"""\[(-?\d+)\]|\[('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]|\.([A-Za-z_]\w*)""")


def fqn_within(fqn: str, module: str) -> bool:
    """Whether the dotted name ``fqn`` (a parameter or module FQN) is ``module`` or inside it;
    ``module`` "" is the root, holding everything."""
    return module == "" or fqn == module or fqn.startswith(module + ".")


def readable_path(key: str) -> str:
    """A batch key path as people write it: ``[1]['input_ids']`` (a keyword argument) is
    ``input_ids``, ``[0][0]`` (the first positional one) is ``args[0]``, and what lies
    inside reads as attributes where its keys are names (``[1]['batch']['input_ids']``
    is ``batch.input_ids``) and as indices where they are not (``args[0][1]``). Plans
    keep ``keystr``'s form (what ``apply_plan`` looks up); this is for printing. A path
    that is not into ``(args, kwargs)`` comes back unchanged."""
    keys = _parse_keys(key)
    if keys is None or len(keys) < 2 or keys[0] not in (0, 1):
        return key
    if keys[0] == 0:
        if not isinstance(keys[1], int):
            return key
        head, rest = f"args[{keys[1]}]", keys[2:]
    else:
        if not isinstance(keys[1], str):
            return key
        head, rest = keys[1] if keys[1].isidentifier() else f"kwargs[{keys[1]!r}]", keys[2:]
    for part in rest:
        if isinstance(part, int):
            head += f"[{part}]"
        elif part.isidentifier():
            head += f".{part}"
        else:
            head += f"[{part!r}]"
    return head


def _parse_keys(key: str) -> list[int | str] | None:
    """``keystr``'s path as its keys (ints for indices, strings for names), or None where
    it is not one."""
    keys: list[int | str] = []
    at = 0
    while at < len(key):
        match = _KEY.match(key, at)
        if match is None:
            return None
        index, quoted, attribute = match.groups()
        keys.append(int(index) if index is not None else ast.literal_eval(quoted) if quoted is not None else attribute)
        at = match.end()
    return keys
