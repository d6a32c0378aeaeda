"""The Plan value: placements, segments and mechanisms, their name checks, the YAML/dict round trip,
and
resolving a plan against a model."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from tierax import names as N
from tierax.errors import TieraxError


class Placement(str, enum.Enum):  # noqa: UP042 — str() and format() keep Enum's spelling
    DEVICE = "device"
    OFFLOAD = "offload"
    REMAT = "remat"

    @classmethod
    def parse(cls, value: Any, where: str) -> Placement:
        if isinstance(value, Placement):
            return value
        try:
            return cls(value)
        except ValueError:
            raise TieraxError(
                f"{where}: placement {value!r} is not valid; use one of: "
                + ", ".join(p.value for p in cls)
            ) from None


def _check_name(name: str, where: str) -> None:
    if name not in N.ALL_NAMES:
        raise TieraxError(
            f"{where}: unknown activation name {name!r}; valid names: {', '.join(N.ALL_NAMES)}"
        )


def _checked(placements: Mapping, where: str) -> MappingProxyType:
    checked = {}
    for name, p in dict(placements).items():
        _check_name(name, where)
        checked[name] = Placement.parse(p, f"{where} entry {name!r}")
    return MappingProxyType(checked)


@dataclass(frozen=True)
class Segment:
    """Layers ``start`` … ``stop − 1`` of a group, whose placements override the group's for these
    layers."""

    start: int
    stop: int
    placements: Mapping[str, Placement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", _checked(self.placements, "plan segment"))

    layers = property(lambda self: f"{self.start}-{self.stop - 1}")


def segment_name(group: str, start: int, stop: int) -> str:
    """The name a segment's scan, inventory rows and compile report use: ``decoder@0-23``."""
    return f"{group}@{start}-{stop - 1}"


@dataclass(frozen=True)
class GroupPlan:
    """Placements for one layer group; names not listed take ``default``.  With ``segments`` (a
    partition of the group's layers, checked against the model in :func:`resolve`) each run of
    layers takes the group's placements overridden by its segment's, and runs as its own scan."""

    placements: Mapping[str, Placement] = field(default_factory=dict)
    default: Placement = Placement.REMAT
    segments: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", _checked(self.placements, "plan"))
        object.__setattr__(self, "default", Placement.parse(self.default, "plan default"))
        object.__setattr__(
            self, "segments", tuple(sorted(self.segments, key=lambda s: (s.start, s.stop)))
        )

    def placement(self, name: str) -> Placement:
        return self.placements.get(name, self.default)


# How offloaded activations move between the passes (the plan's ``mechanism`` key).
MECHANISMS = {
    "prefetch": "tierax's layer scan: stores as produced, loads one layer ahead of their use",
    "policy": "XLA's host offloader under jax.checkpoint's offload policy: loads in the layer that "
    "uses them",
}
DEFAULT_MECHANISM = "prefetch"
# XLA flag presets (schedules) a mechanism is not offered with, and why.  XLA's pipelined host
# offloading rewrites the host copies of XLA's own offloader; applied to the prefetching scan's
# stores it exposes them (bench/results/hide_grid.json, the lhs-pipelined cases).
REFUSED_PRESETS = {
    ("prefetch", "lhs-pipelined"): "XLA's pipelined host offloading does not hide the prefetching "
    "scan's stores (measured: bench/results/hide_grid.json, the lhs-pipelined cases)",
}


def check_mechanism_preset(plan: Plan | None, preset: str, where: str) -> None:
    """Refuse a plan whose offload mechanism is not offered under the XLA ``preset`` (a plan that
    offloads nothing runs no mechanism and passes; ``plan=None``: the planner's default mechanism,
    before it has chosen).

    Raises:
      TieraxError: the pair is refused; the message names the remedies.
    """
    mechanism = plan.mechanism if plan is not None else DEFAULT_MECHANISM
    why = REFUSED_PRESETS.get((mechanism, preset))
    if why and (plan is None or _offloads(plan)):
        raise TieraxError(
            f"{where}: mechanism {mechanism!r} is not offered with the {preset!r} preset: {why}. "
            f"Use the 'lhs' preset (or 'none'), or a plan with 'mechanism: policy' (XLA's own "
            f"host offloader, which {preset!r} pipelines)"
        )


@dataclass(frozen=True)
class Plan:
    """A placement for every activation of every layer group.

    Attributes:
      name: a label (preset name or file stem).
      groups: layer group name → :class:`GroupPlan`.
      description: one line for humans.
      mesh: the mesh it was planned for (``tierax plan --mesh auto``: axis → size, every axis of
        :data:`tierax.mesh.AXES`), or None; verbs that take ``--mesh`` use it when none is given.
      microbatch: the sequences per device (of the batch axes) per microstep it was planned for
        (``tierax plan --mesh auto``), or None; verbs that take ``--microbatch`` use it when none
        is given and refuse a different one.
      grad_accum: microsteps per optimizer step it was planned for (``--mesh auto``), or None.
    """

    name: str
    groups: Mapping[str, GroupPlan]
    description: str = ""
    mechanism: str = DEFAULT_MECHANISM
    mesh: Mapping[str, int] | None = None
    microbatch: int | None = None
    grad_accum: int | None = None

    def __post_init__(self) -> None:
        for key in ("microbatch", "grad_accum"):
            _checked_count(getattr(self, key), f"plan {self.name!r}: {key}")
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        if self.mesh is not None:
            object.__setattr__(
                self, "mesh", MappingProxyType(_checked_mesh(self.mesh, f"plan {self.name!r}"))
            )
        if self.mechanism not in MECHANISMS:
            raise TieraxError(
                f"plan {self.name!r}: mechanism {self.mechanism!r} is not valid; use one of: "
                + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items())
            )

    # --- YAML / dict form -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        groups = {}
        for g, gp in self.groups.items():
            entry: dict[str, Any] = {"default": gp.default.value}
            entry.update({n: p.value for n, p in gp.placements.items()})
            if gp.segments:
                entry["segments"] = [
                    {"layers": s.layers} | {n: p.value for n, p in s.placements.items()}
                    for s in gp.segments
                ]
            groups[g] = entry
        out = {"plan": self.name, "description": self.description}
        if self.mechanism != DEFAULT_MECHANISM:
            out["mechanism"] = self.mechanism
        if self.mesh is not None:
            out["mesh"] = dict(self.mesh)
        for key in ("microbatch", "grad_accum"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out | {"groups": groups}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> Plan:
        if not isinstance(data, Mapping):
            raise TieraxError(
                f"{source}: a plan must be a mapping with keys plan, description, groups"
            )
        unknown = set(data) - set(PLAN_KEYS)
        if unknown:
            raise TieraxError(
                f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"a plan has keys: {', '.join(PLAN_KEYS)}"
            )
        groups_in = data.get("groups")
        if not isinstance(groups_in, Mapping) or not groups_in:
            raise TieraxError(f"{source}: 'groups' must map layer group names to placements")
        groups = {}
        for g, entry in groups_in.items():
            if not isinstance(entry, Mapping):
                raise TieraxError(f"{source}: group {g!r} must map activation names to placements")
            entry = dict(entry)
            default = Placement.parse(
                entry.pop("default", Placement.REMAT), f"{source}: group {g!r} default"
            )
            segments = _parse_segments(entry.pop("segments", None), f"{source}: group {g!r}")
            for n in entry:
                _check_name(n, f"{source}: group {g!r}")
            placements = {
                n: Placement.parse(p, f"{source}: group {g!r}, {n}") for n, p in entry.items()
            }
            groups[str(g)] = GroupPlan(placements, default, segments)
        mechanism = data.get("mechanism", DEFAULT_MECHANISM)
        if mechanism not in MECHANISMS:
            raise TieraxError(
                f"{source}: mechanism {mechanism!r} is not valid; use one of: "
                + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items())
            )
        mesh = data.get("mesh")
        return cls(
            str(data.get("plan", "custom")),
            groups,
            str(data.get("description", "") or ""),
            mechanism,
            None if mesh is None else _checked_mesh(mesh, f"{source}: mesh"),
            _checked_count(data.get("microbatch"), f"{source}: microbatch"),
            _checked_count(data.get("grad_accum"), f"{source}: grad_accum"),
        )

    def to_yaml(self) -> str:
        # allow_unicode: descriptions keep "×" and "≥" readable, not as \xD7 escapes
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "plan") -> Plan:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise TieraxError(f"{source}: not valid YAML ({e})") from None
        return cls.from_dict(data, source=source)


PLAN_KEYS = ("plan", "description", "mechanism", "mesh", "microbatch", "grad_accum", "groups")


def _checked_count(raw: Any, where: str) -> int | None:
    """A plan's ``microbatch`` or ``grad_accum``: None, or an integer ≥ 1."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise TieraxError(f"{where}: expected an integer ≥ 1, got {raw!r}")
    return raw


def _checked_mesh(raw: Any, where: str) -> dict[str, int]:
    """A plan's ``mesh``: every axis of :data:`tierax.mesh.AXES` (missing ones 1), sizes ≥ 1."""
    from tierax.mesh import AXES, MeshShape

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


def _parse_segments(raw: Any, where: str) -> tuple[Segment, ...]:
    """``segments: [{layers: "0-23", query_proj: offload, ...}, ...]`` (layer ranges inclusive)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise TieraxError(
            f"{where}: 'segments' must be a list of mappings, each with 'layers: A-B' and "
            f"placements"
        )
    out = []
    for k, seg in enumerate(raw):
        if not isinstance(seg, Mapping) or "layers" not in seg:
            raise TieraxError(
                f"{where}, segment {k}: give 'layers: A-B' (inclusive layer indices) and placements"
            )
        seg = dict(seg)
        layers = str(seg.pop("layers")).replace(" ", "")
        a, sep, b = layers.partition("-")
        if not (a.isdigit() and (not sep or b.isdigit())):
            raise TieraxError(
                f"{where}, segment {k}: layers {layers!r} is not a range like '0-23' or one layer "
                f"'7'"
            )
        start, last = int(a), int(b) if sep else int(a)
        if last < start:
            raise TieraxError(f"{where}, segment {k}: layers {layers!r} ends before it starts")
        if "default" in seg:
            raise TieraxError(
                f"{where}, segment {k}: a segment overrides named placements only; set 'default' "
                "on the group"
            )
        for n in seg:
            _check_name(n, f"{where}, segment {k}")
        out.append(
            Segment(
                start,
                last + 1,
                {n: Placement.parse(p, f"{where}, segment {k}, {n}") for n, p in seg.items()},
            )
        )
    return tuple(out)


def _check_partition(gp: GroupPlan, num_layers: int, where: str) -> None:
    """The segments cover layers 0 … num_layers − 1, each exactly once."""
    covered = [0] * num_layers
    for s in gp.segments:
        if s.stop > num_layers:
            raise TieraxError(
                f"{where}: segment {s.layers} goes past the group's last layer ({num_layers - 1})"
            )
        for i in range(s.start, s.stop):
            covered[i] += 1
    for bad, what in (
        ([i for i, c in enumerate(covered) if c > 1], "more than one segment"),
        ([i for i, c in enumerate(covered) if c == 0], "no segment"),
    ):
        if bad:
            raise TieraxError(
                f"{where}: layer(s) {', '.join(map(str, bad))} in {what}; segments must cover "
                f"layers 0-{num_layers - 1} exactly once"
            )


def resolve(plan: Plan, cfg) -> dict[str, dict[str, Placement]]:
    """Every (group, activation) of ``cfg`` → its placement under ``plan``; a segmented group gives
    one
    entry per segment, keyed by :func:`segment_name` (``decoder@0-23``), in layer order.

    Raises:
      TieraxError: the plan names a group or an activation the model lacks, or a group's segments do
        not cover its layers exactly once.
    """
    groups = {g.name: g for g in cfg.layer_groups()}
    for gname, gp in plan.groups.items():
        if gname not in groups:
            raise TieraxError(
                f"plan {plan.name!r} names layer group {gname!r}, which model {cfg.name!r} does "
                f"not have; its groups: {', '.join(groups)}"
            )
        named = list(gp.placements) + [n for s in gp.segments for n in s.placements]
        missing = list(dict.fromkeys(n for n in named if n not in groups[gname].activations))
        if missing:
            raise TieraxError(
                f"plan {plan.name!r}, group {gname!r}: model {cfg.name!r} has no activation "
                f"{', '.join(map(repr, missing))}; valid names here: "
                f"{', '.join(groups[gname].activations)}"
            )
        if gp.segments:
            _check_partition(gp, groups[gname].num_layers, f"plan {plan.name!r}, group {gname!r}")
    out = {}
    for gname, g in groups.items():
        gp = plan.groups.get(gname, GroupPlan())
        if not gp.segments:
            out[gname] = {n: gp.placement(n) for n in g.activations}
        for s in gp.segments:
            where = segment_name(gname, s.start, s.stop)
            out[where] = {n: s.placements.get(n, gp.placement(n)) for n in g.activations}
            _check_runnable_segment(plan, s, out[where], where)
    return out


def _check_runnable_segment(
    plan: Plan, s: Segment, placements: Mapping[str, Placement], where: str
) -> None:
    """What the segmented scan can run.  Checked here, where every verb resolves its plan, so that
    simulate and plan refuse what compile, verify and train would (and before anything compiles)."""
    if plan.mechanism != DEFAULT_MECHANISM:
        raise TieraxError(
            f"plan {plan.name!r} has segments, which run in tierax's segmented scan (mechanism "
            f"{DEFAULT_MECHANISM}); mechanism {plan.mechanism!r} applies to unsegmented plans "
            "only: remove 'mechanism' or the segments"
        )
    if placements.get(N.DECODER_LAYER_INPUT) is Placement.OFFLOAD:
        raise TieraxError(
            f"plan {plan.name!r}, {where}: a segment keeps decoder_layer_input on device (the "
            "scan's own residual); offload it only in an unsegmented plan (mechanism: policy)"
        )
    offload = sorted(n for n, p in placements.items() if p is Placement.OFFLOAD)
    if offload and s.stop - s.start == 1:  # XLA drops a host round trip that no loop separates
        raise TieraxError(
            f"plan {plan.name!r}, {where}: a one-layer segment cannot offload "
            f"({', '.join(offload)}); XLA removes the host copy there. Make the segment at least "
            "2 layers"
        )


def segments_of(plan: Plan, cfg) -> dict[str, list[tuple[int, int, str]]]:
    """Segmented groups only: group → [(start, stop, segment name)] in layer order (validated)."""
    resolve(plan, cfg)
    return {
        g: [(s.start, s.stop, segment_name(g, s.start, s.stop)) for s in gp.segments]
        for g, gp in plan.groups.items()
        if gp.segments
    }


def _offloads(plan: Plan) -> bool:
    """Whether any group, default or segment of ``plan`` places a name in host memory."""
    for gp in plan.groups.values():
        places = [gp.default, *gp.placements.values()]
        places += [p for seg in gp.segments for p in seg.placements.values()]
        if Placement.OFFLOAD in places:
            return True
    return False
