"""What a plan was planned for: the model, target, mesh, microbatch, sequence length, gradient
accumulation and schedule, recorded in the plan file and read back by every verb that takes one.

Its YAML form is the plan's ``planned_for`` mapping::

    planned_for:
      model: tiny-llama            # a named config (with its --set overrides), or
                                   # sha256:<16 hex digits> of a --model-config file's bytes
      target: h200
      mesh: {data: 1, fsdp: 8, tensor: 1, expert: 1}
      microbatch: 8                # sequences per device of the batch axes, per microstep
      seq: 4096
      grad_accum: 4                # microsteps per optimizer update
      schedule: lhs

:func:`merge_planned_for` is the one place a verb's flags meet the record: a flag that differs is
refused naming both values, a flag not given takes the plan's value, and a value neither gives
takes the verb's default (with a note when the plan is a file that does not record it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from tierax.errors import TieraxError

# The keys in the order the YAML form writes them, and the flag each is given by on the CLI.
FLAGS = {
    "model": "--model",
    "target": "--target",
    "mesh": "--mesh",
    "microbatch": "--microbatch",
    "seq": "--seq",
    "grad_accum": "--grad-accum",
    "schedule": "--schedule",
}
KEYS = tuple(FLAGS)
DIGEST_PREFIX = "sha256:"
_COUNTS = ("microbatch", "seq", "grad_accum")
_TEXTS = ("model", "target", "schedule")


def model_digest(data: bytes) -> str:
    """The ``model`` entry of a model config file: ``sha256:`` and 16 hex digits of its bytes."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()[:16]


def model_name(name: str, overrides: Sequence[str] = ()) -> str:
    """The ``model`` entry of a named config with ``--set`` overrides: ``NAME --set K=V ...``."""
    return " ".join([name, *(f"--set {o}" for o in overrides)])


def parse_model_name(entry: str) -> tuple[str, list[str]]:
    """:func:`model_name`'s inverse: (name, overrides)."""
    name, *sets = entry.split(" --set ")
    return name, sets


@dataclass(frozen=True)
class PlannedFor:
    """What a plan was planned for; None: not recorded (a preset, an older plan file)."""

    model: str | None = None
    target: str | None = None
    mesh: Mapping[str, int] | None = None
    microbatch: int | None = None
    seq: int | None = None
    grad_accum: int | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        for key in _COUNTS:
            _checked_count(getattr(self, key), f"planned_for {key}")
        for key in _TEXTS:
            v = getattr(self, key)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise TieraxError(f"planned_for {key}: expected a non-empty string, got {v!r}")
        if self.mesh is not None:
            object.__setattr__(
                self, "mesh", MappingProxyType(checked_mesh(self.mesh, "planned_for mesh"))
            )

    @property
    def missing(self) -> tuple[str, ...]:
        """The keys this record does not carry."""
        return tuple(k for k in KEYS if getattr(self, k) is None)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k in KEYS:
            v = getattr(self, k)
            if v is not None:
                out[k] = dict(v) if k == "mesh" else v
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> PlannedFor:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TieraxError(
                f"{where}: planned_for must map {', '.join(KEYS)} to what the plan was planned for"
            )
        unknown = sorted(str(k) for k in raw if k not in KEYS)
        if unknown:
            raise TieraxError(
                f"{where}: planned_for has unknown key(s) {', '.join(unknown)}; its keys: "
                + ", ".join(KEYS)
            )
        try:
            return cls(**{str(k): v for k, v in raw.items()})
        except TieraxError as e:
            raise TieraxError(f"{where}: {e}") from None

    def replace(self, **values) -> PlannedFor:
        return PlannedFor(**({f.name: getattr(self, f.name) for f in fields(self)} | values))


def common(records: Sequence[tuple[str, PlannedFor]]) -> PlannedFor:
    """One record for plans used together (``bench --plans a.yaml,b.yaml``): each key their
    common value, or None where none records it.

    Raises:
      TieraxError: two plans record different values for one key.
    """
    out = {}
    for key in KEYS:
        found = {}
        for name, rec in records:
            v = getattr(rec, key)
            if v is not None:
                found.setdefault(_shown(key, v), name)
        if len(found) > 1:
            both = " and ".join(f"{v} ({n})" for v, n in found.items())
            raise TieraxError(
                f"the plans were planned for different {key} values: {both}; give plans planned "
                f"for one {key}"
            )
        out[key] = next((getattr(r, key) for _, r in records if getattr(r, key) is not None), None)
    return PlannedFor(**out)


def merge_planned_for(
    planned: PlannedFor,
    given: Mapping[str, Any],
    defaults: Mapping[str, Any],
    *,
    plan: str | None,
    flags: Mapping[str, str] = FLAGS,
    units: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The values a verb runs with, for each key of ``given`` (None: the flag was not given).

    A given value that differs from the plan's is refused; a value not given is the plan's, else
    ``defaults[key]``.  ``plan``: the plan file's name in messages (None: no plan file, so nothing
    to compare and nothing assumed); ``flags``: how each key is spelled where it was given;
    ``units``: what a key's value counts, appended to the plan's value in messages.

    Returns:
      (key → value, notes): a note for each default taken where the plan file records no value
      (a file from before the key was recorded, or another tool's file).

    Raises:
      TieraxError: a given value differs from the plan's; the message names both and the fix.
    """
    values, notes = {}, []
    units = units or {}
    for key, value in given.items():
        flag = flags.get(key, key)
        recorded = getattr(planned, key)
        if value is not None and recorded is not None:
            if _shown(key, value) != _shown(key, recorded):
                raise TieraxError(
                    f"{flag} {_shown(key, value)} differs from the {key} plan {plan} was planned "
                    f"for ({_shown(key, recorded)}{units.get(key, '')}); drop {flag} (the plan's "
                    f"is used) or plan again with {flag} {_shown(key, value)}"
                )
            values[key] = value
        elif value is not None:
            values[key] = value
        elif recorded is not None:
            values[key] = recorded
        else:
            values[key] = defaults.get(key)
            if plan is not None:
                notes.append(
                    f"note: plan {plan} does not record the {key} it was planned for (written "
                    f"before tierax recorded it, or by another tool); assumed {flag} "
                    f"{_shown(key, values[key]) if values[key] is not None else '(none)'}"
                )
    return values, notes


def _shown(key: str, value: Any) -> str:
    if key == "mesh":
        return ",".join(f"{a}={n}" for a, n in checked_mesh(value, "mesh").items())
    if key == "model" and not str(value).startswith(DIGEST_PREFIX):
        return canonical_model_name(str(value))
    return str(value)


def canonical_model_name(entry: str) -> str:
    """A ``NAME --set K=V ...`` entry as the config it names: each key's last value (a later
    ``--set`` wins), keys in order — the same model however its overrides were ordered."""
    name, sets = parse_model_name(entry)
    last = {}
    for kv in sets:
        k, _, v = kv.partition("=")
        last[k.strip()] = v.strip()
    return model_name(name, [f"{k}={last[k]}" for k in sorted(last)])


def _checked_count(raw: Any, where: str) -> int | None:
    """None, or an integer ≥ 1."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise TieraxError(f"{where}: expected an integer ≥ 1, got {raw!r}")
    return raw


def checked_mesh(raw: Any, where: str) -> dict[str, int]:
    """A mesh mapping: every axis of :data:`tierax.mesh.AXES` (missing ones 1), sizes ≥ 1."""
    from tierax.mesh import AXES, MeshShape

    if isinstance(raw, MeshShape):
        return raw.to_dict()
    if not isinstance(raw, Mapping) or not raw:
        raise TieraxError(f"{where}: a mesh maps axes ({', '.join(AXES)}) to sizes, e.g. fsdp: 8")
    unknown = sorted(str(a) for a in raw if a not in AXES)
    if unknown:
        raise TieraxError(
            f"{where}: unknown axis {', '.join(unknown)}; a mesh has axes {', '.join(AXES)}"
        )
    try:
        return MeshShape(**{str(a): v for a, v in raw.items()}).to_dict()
    except TieraxError as e:
        raise TieraxError(f"{where}: {e}") from None
