"""The one typed config loader: frozen dataclasses are the schema, YAML/CLI values are checked
against them.

Model configs (:mod:`tierax.models.config`) and training configs
(:mod:`tierax.train.config`) both read their fields through these functions, so
a wrong type, an unknown key (with a did-you-mean) or an unreadable file reads
the same everywhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import pathlib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tierax.errors import TieraxError

_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name → (scalar type, accepts None), in declaration order."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        optional = isinstance(t, types.UnionType) and type(None) in t.__args__
        if optional:
            t = next(a for a in t.__args__ if a is not type(None))
        out[f.name] = (t, optional)
    return out


def coerce(key: str, value: Any, expected: type, where: str) -> Any:
    """``value`` checked against the annotation ``expected`` (ints widen to float; NaN/inf
    refused)."""
    if expected is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and math.isfinite(number):
            return number
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, expected):  # bool, str
        return value
    raise TieraxError(
        f"{where}: {key} expects {expected.__name__} "
        f"({_EXPECTED.get(expected, expected.__name__)}), got {value!r} ({type(value).__name__})"
    )


def scalar(key: str, value: Any, expected: tuple[type, bool], where: str) -> Any:
    """One field's value: null only where the field is optional, never a mapping or list."""
    typ, optional = expected
    if value is None:
        if optional:
            return None
        raise TieraxError(f"{where}: {key} must not be null")
    if isinstance(value, (Mapping, list)):
        raise TieraxError(
            f"{where}: {key} expects a single {typ.__name__}, got {type(value).__name__} {value!r}"
        )
    return coerce(key, value, typ, where)


def did_you_mean(key: Any, valid: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(str(key), list(valid), n=1)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""


def unknown_keys(
    keys: Sequence[str], valid: Sequence[str], where: str, prefix: str = ""
) -> TieraxError:
    """The error for keys a schema does not have, listing the valid ones."""
    hint = did_you_mean(keys[0], valid, prefix) if len(keys) == 1 else ""
    return TieraxError(
        f"{where}: unknown key{'s' if len(keys) > 1 else ''} "
        f"{', '.join(repr(prefix + str(k)) for k in keys)}{hint}; valid "
        f"keys{' in ' + prefix.rstrip('.') if prefix else ''}: "
        f"{', '.join(prefix + v for v in valid)}"
    )


def read_yaml(path: str | os.PathLike, what: str, example: str) -> Any:
    """Parse a YAML file.

    Raises:
      TieraxError: missing, unreadable, not UTF-8, or not YAML (``example`` says what a good one
          is).
    """
    p = pathlib.Path(path)
    if p.is_dir():
        inside = [f.name for f in (p / "config.json", p / "config.yaml") if f.is_file()]
        hint = f"give the file in it, e.g. {str(p / inside[0])!r}" if inside else example
        raise TieraxError(f"{what} {str(p)!r} is a directory, not a file; {hint}")
    if not p.exists():
        raise TieraxError(f"{what} {str(p)!r} does not exist; {example}")
    if not p.is_file():  # a device, a pipe, a socket: not a config file
        raise TieraxError(f"{what} {str(p)!r} is not a regular file; {example}")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise TieraxError(
            f"{what} {str(p)!r} is not UTF-8 text ({e.reason} at byte {e.start}); {example}"
        ) from None
    except (OSError, yaml.YAMLError) as e:
        raise TieraxError(f"{what} {str(p)!r} is not valid YAML ({e}); {example}") from None
