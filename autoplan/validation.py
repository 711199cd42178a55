"""One validation layer for the JSON files autoplan reads: plans, cluster profiles, cache entries.

The formats are JSON Schema files shipped in ``autoplan/schemas/`` (``plan.schema.json``,
``profile.schema.json``), so that editors and other tools can check a file too; here they
are checked with ``jsonschema``, and the first violation becomes autoplan's own error,
naming the file, the field and the fix. Checks a schema cannot express (a placement per
mesh axis, shard dims in range, sizes that divide) live next to each format's loader.

Two departures from plain JSON Schema, both stricter: "number" means a finite number
(Python's ``json`` accepts NaN and Infinity, JSON itself does not), and a boolean is never a
number. Schemas carry a few ``x-`` annotations that only shape the messages:
``x-expected`` (what a value should look like), ``x-unknown`` (the noun for an unknown
name), ``x-key`` (what an object's keys should look like), ``x-bound`` (why a maximum is
physical) and ``x-fix`` (the fix, where it differs from the document's).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path

import jsonschema

from autoplan.errors import AutoplanError

_TYPES = {
    "number": "a finite number",
    "integer": "a whole number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "string": "a string",
}


def _finite_number(checker, value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _finite_number),
)


def schema_path(name: str):
    """The shipped schema file ``name`` (``"plan"``, ``"profile"``) as an importlib resource."""
    return resources.files("autoplan") / "schemas" / f"{name}.schema.json"


@functools.cache
def _validator(name: str):
    return _Validator(json.loads(schema_path(name).read_text(encoding="utf-8")))


def read_json(path: str | Path, error: type[AutoplanError], what: str, missing_fix: str, fix: str):
    """The JSON data in ``path``; a missing, unreadable, binary or malformed file is ``error``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"no {what} {path}", hint=missing_fix) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, expected a JSON file", hint=missing_fix) from None
    except OSError as err:
        raise error(f"could not read {what} {path}: {err.strerror or err}", hint="check the file's permissions") from err
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not valid JSON (it is not UTF-8 text)", hint=fix) from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise error(f"{what} {path} is not valid JSON ({err})", hint=fix) from None


def check_schema(data, name: str, error: type[AutoplanError], what: str, fix: str) -> None:
    """Raise ``error`` for the most relevant way ``data`` breaks schema ``name``.

    ``what`` names the document ("plan plans_out/x.json"), ``fix`` is the hint where the
    schema gives none.
    """
    try:
        errors = list(_validator(name).iter_errors(data))
    except RecursionError:
        raise error(f"{what} is nested too deeply to be a valid file", hint=fix) from None
    if not errors:
        return
    # The first problem in the file (a wrong type before a bound at the same place), so
    # that the same file always gives the same message: jsonschema visits some keys in set order.
    violation = min(errors, key=lambda err: (_document_order(data, err.absolute_path), err.validator != "type"))
    problem, own_fix = _describe(violation)
    raise error(f"{what}{problem}", hint=own_fix or fix)


def field_path(parts) -> str:
    """``["links", "intra_node", "latency_s"]`` -> ``links.intra_node.latency_s``; list
    indices as ``[1]``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        name = str(part)
        if not name.isprintable():  # a key with a newline or a control character: the message stays one line
            name = json.dumps(name)
        text += f".{name}" if text else name
    return text


def _document_order(data, path) -> tuple[int, ...]:
    """Where ``path`` lies in ``data``: the position of each key or index along it."""
    order, node = [], data
    for part in path:
        if isinstance(node, dict):
            order.append(list(node).index(part) if part in node else len(node))
        elif isinstance(node, list) and isinstance(part, int):
            order.append(part)
        else:
            break
        node = node[part] if (isinstance(node, dict) and part in node) or isinstance(node, list) else None
    return tuple(order)


def _describe(error) -> tuple[str, str | None]:
    """(problem, fix or None) for one jsonschema error, in autoplan's words."""
    at = field_path(error.absolute_path) or "the top level"
    schema, kind, value = error.schema, error.validator, error.instance
    fix = schema.get("x-fix") if isinstance(schema, dict) else None
    if kind == "required":
        missing = next(key for key in error.validator_value if key not in value)
        where = field_path([*error.absolute_path, missing])
        fix = schema.get("properties", {}).get(missing, {}).get("x-fix-missing")
        return f" lacks {where}", fix
    if "propertyNames" in error.schema_path:
        return _bad_key(schema, value, at)
    if "x-unknown" in schema and kind in ("pattern", "enum", "const"):
        return f": unknown {schema['x-unknown']} {value!r} at {at}", fix
    if kind == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        expected = " or ".join(_TYPES.get(t) or t for t in types)
    elif kind == "exclusiveMinimum":
        expected = "a positive number" if error.validator_value == 0 else f"a number > {error.validator_value:g}"
    elif kind == "minimum":
        expected = f"a number >= {error.validator_value:g}"
    elif kind in ("maximum", "exclusiveMaximum"):
        sign = "<=" if kind == "maximum" else "<"
        expected = f"a number {sign} {error.validator_value:g}"
    elif kind == "const":
        expected = repr(error.validator_value)
    elif kind == "enum":
        expected = "one of " + ", ".join(map(repr, error.validator_value))
    elif kind == "minItems":
        expected = f"a list of at least {error.validator_value}"
    elif kind == "uniqueItems":
        expected = "distinct items"
    elif kind == "additionalProperties":
        extra = sorted(set(value) - set(schema.get("properties", {})))
        known = ", ".join(sorted(schema.get("properties", {})))
        return f": unexpected key {', '.join(map(repr, extra))} at {at} (known keys: {known})", fix
    elif "x-expected" in schema:
        expected = schema["x-expected"]
    else:
        return f": {error.message} at {at}", fix
    bound = f" (the bound: {schema['x-bound']})" if "x-bound" in schema and kind in ("minimum", "maximum", "exclusiveMaximum") else ""
    return f": expected {expected} at {at}, got {_short(value)}{bound}", fix


def _bad_key(names: dict, key, at: str) -> tuple[str, str | None]:
    """A key of an object that its ``propertyNames`` schema (``names``) refuses; jsonschema
    reports it at the object's path with the key as the instance."""
    if "x-unknown" in names:
        known = ", ".join(names.get("enum", []))
        return f": unknown {names['x-unknown']} {key!r} at {at}" + (f", expected one of {known}" if known else ""), names.get("x-fix")
    return f": expected {names.get('x-key', 'a valid key')} as a key of {at}, got {key!r}", names.get("x-fix")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
