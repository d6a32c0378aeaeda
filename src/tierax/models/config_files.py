"""Model config files and overrides: the dataclasses of :mod:`tierax.models.config` are the schema.

A config file is ``family`` plus the dataclass fields (``load_model_config`` /
``config_from_dict``); ``KEY=VALUE`` overrides go through ``apply_overrides``;
``config_to_dict`` / ``config_to_yaml`` write the same form back.  Field values
are checked by :mod:`tierax.schema`, the loader training configs use too.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tierax import schema
from tierax.errors import TieraxError
from tierax.models.config import DeepSeekConfig, LlamaConfig, ModelConfig

FAMILIES: dict[str, type] = {"llama": LlamaConfig, "deepseek": DeepSeekConfig}


def _field_types(cls: type) -> dict[str, type]:
    """Field name → annotated scalar type, in declaration order (model fields are never
    optional)."""
    return {k: t for k, (t, _) in schema.field_types(cls).items()}


def _valid_keys(cls: type) -> str:
    return "family, " + ", ".join(_field_types(cls))


def config_from_dict(data: Mapping, *, source: str) -> ModelConfig:
    """Build a config from ``family`` plus dataclass fields, as in a model config file.

    Args:
      data: ``{"family": "llama" | "deepseek", <field>: <value>, ...}``; fields with a
        default may be left out.
      source: where ``data`` came from (a file path), prefixed to every message.

    Raises:
      TieraxError: not a mapping, missing or unknown family, unknown or missing keys,
        a value of the wrong type, or inconsistent values (``__post_init__``).
    """
    if not isinstance(data, Mapping):
        raise TieraxError(
            f"{source}: a model config must be a mapping of keys to values, got "
            f"{type(data).__name__}; "
            "see `tierax models show tiny-llama` for the form"
        )
    family = data.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
        what = "missing 'family'" if family is None else f"unknown family {family!r}"
        raise TieraxError(f"{source}: {what}; set family to one of: {', '.join(FAMILIES)}")
    cls = FAMILIES[family]
    types = _field_types(cls)
    unknown = [k for k in data if k != "family" and k not in types]
    if unknown:
        hint = schema.did_you_mean(unknown[0], list(_field_types(cls))) if len(unknown) == 1 else ""
        raise TieraxError(
            f"{source}: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}{hint} for family {family!r}"
            f"{''.join(_other_family(k, family) for k in unknown)}; valid keys: "
            f"{_valid_keys(cls)}"
        )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if k not in data]
    if missing:
        raise TieraxError(
            f"{source}: missing required key{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"for family {family!r}; required: {', '.join(required)}"
        )
    values = {k: schema.coerce(k, v, types[k], source) for k, v in data.items() if k != "family"}
    try:
        return cls(**values)
    except TieraxError as e:
        raise TieraxError(f"{source}: {e}") from None


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """``family`` first, then every field: the form ``config_from_dict`` reads back unchanged."""
    return {"family": cfg.family, **dataclasses.asdict(cfg)}


def config_to_yaml(cfg: ModelConfig) -> str:
    """``config_to_dict`` as YAML: a file ``load_model_config`` (``--model-config``) accepts."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def _other_family(key: str, family: str) -> str:
    """Why ``key``, a key of another family, is not one of ``family``'s, and what to use."""
    others = [f for f, c in FAMILIES.items() if f != family and key in _field_types(c)]
    return f" (a key of the {', '.join(others)} family)" if others else ""


def _parse_override(text: str, cls: type) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TieraxError(f"--set {text!r}: expected the form KEY=VALUE, e.g. --set d_model=512")
    types = _field_types(cls)
    if key == "family":
        raise TieraxError(
            f"--set {text!r}: the family cannot be overridden; start from a config of that family "
            f"(--model NAME or --model-config FILE)"
        )
    if key not in types:
        raise TieraxError(
            f"--set {text!r}: unknown key {key!r}{schema.did_you_mean(key, list(types))} for a "
            f"{cls.family} config{_other_family(key, cls.family)}; valid keys: {', '.join(types)}"
        )
    if types[key] is str:  # the command line has no quoting: take the text as is
        value: Any = raw.strip()
    else:
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
    return key, schema.coerce(key, value, types[key], f"--set {text!r}")


def apply_overrides(cfg: ModelConfig, overrides: Sequence[str]) -> ModelConfig:
    """``cfg`` with ``KEY=VALUE`` overrides applied in order (a later one wins).

    Values are read as YAML scalars (``512`` int, ``2.5`` / ``1e-5`` float, ``true``
    bool); string fields take the text as given.  If the result differs from
    ``cfg`` and ``name`` was not overridden, the name becomes ``<name>+overrides``.

    Raises:
      TieraxError: an override without ``=``, an unknown key (the valid ones are
        listed), a value of the wrong type, or an inconsistent result.
    """
    if not overrides:
        return cfg
    cls = type(cfg)
    changes = dict(_parse_override(o, cls) for o in overrides)
    try:
        new = dataclasses.replace(cfg, **changes)
    except TieraxError as e:
        raise TieraxError(f"{cfg.name} with --set {' '.join(overrides)}: {e}") from None
    if "name" not in changes and new != cfg and not cfg.name.endswith("+overrides"):
        new = dataclasses.replace(new, name=f"{cfg.name}+overrides")
    return new


FILE_HINT = "write one with `tierax models show NAME > FILE.yaml` and edit it"


def load_model_config(path: str | pathlib.Path) -> ModelConfig:
    """Read a tierax model config file (``family`` plus dataclass fields); other tools' files are
    read by :func:`tierax.interop.files.load_model_config`.

    Raises:
      TieraxError: the file is missing or unreadable, not YAML, not a mapping, or
        not a valid config (see ``config_from_dict``).
    """
    data = schema.read_yaml(path, "model config file", FILE_HINT)
    return config_from_dict(data, source=str(path))
