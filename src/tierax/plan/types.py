"""The Plan value: placements, segments and mechanisms, their name checks, the YAML/dict round trip,
and
resolving a plan against a model."""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from tierax import names as N
from tierax.errors import TieraxError
from tierax.plan.planned_for import PlannedFor


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


# Keys a plan's group (or segment) mapping uses itself: no activation can be named so there
# ("unnamed": the key of a group's untagged intermediates in plans that place them).
RESERVED_KEYS = ("default", "segments", "layers", "unnamed")


def _check_name(name: Any, where: str) -> None:
    """An activation name as a plan may carry it: any non-empty string a ``checkpoint_name`` can
    tag (tierax's own models tag :data:`tierax.names.ALL_NAMES`; a model traced through
    :mod:`tierax.api` tags its own).  Whether the model has it is checked in :func:`resolve`."""
    if not isinstance(name, str) or not name or name != name.strip() or name in RESERVED_KEYS:
        raise TieraxError(
            f"{where}: {name!r} is not an activation name; give the string the model tags with "
            f"checkpoint_name (tierax's models: {', '.join(N.ALL_NAMES)})"
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
    # the segment's unnamed intermediates (GroupPlan.unnamed); None: the group's
    unnamed: Placement | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", _checked(self.placements, "plan segment"))
        if self.unnamed is not None:
            unnamed = Placement.parse(self.unnamed, "plan segment unnamed")
            if unnamed is Placement.OFFLOAD:
                raise TieraxError(
                    "plan segment: unnamed: offload is not valid; use remat or device"
                )
            object.__setattr__(self, "unnamed", unnamed)

    layers = property(lambda self: f"{self.start}-{self.stop - 1}")


def segment_name(group: str, start: int, stop: int) -> str:
    """The name a segment's scan, inventory rows and compile report use: ``decoder@0-23``."""
    return f"{group}@{start}-{stop - 1}"


def is_segment(group: str) -> bool:
    """Whether ``group`` names a segment of a group (:func:`segment_name`), not a whole group."""
    return "@" in group


# The key of a group's unnamed intermediates in a plan's YAML form and in explicit placements
# ``{(group, UNNAMED): Placement}``: what jax.checkpoint does with every value no name tags.
UNNAMED = "unnamed"


@dataclass(frozen=True)
class GroupPlan:
    """Placements for one layer group; names not listed take ``default``.  With ``segments`` (a
    partition of the group's layers, checked against the model in :func:`resolve`) each run of
    layers takes the group's placements overridden by its segment's, and runs as its own scan.

    ``unnamed``: the group's intermediates that no name tags.  ``remat`` (the default, MaxText's
    ``custom`` and ``minimal*`` policies: ``save_and_offload_only_these_names``) recomputes them
    in the backward pass, whatever the names' placements; ``device`` keeps every intermediate (no
    rematerialisation at all), which needs every name on device (the ``save-all`` preset)."""

    placements: Mapping[str, Placement] = field(default_factory=dict)
    default: Placement = Placement.REMAT
    segments: tuple[Segment, ...] = ()
    unnamed: Placement = Placement.REMAT

    def __post_init__(self) -> None:
        object.__setattr__(self, "placements", _checked(self.placements, "plan"))
        object.__setattr__(self, "default", Placement.parse(self.default, "plan default"))
        unnamed = Placement.parse(self.unnamed, "plan unnamed")
        if unnamed is Placement.OFFLOAD:
            raise TieraxError(
                "plan: unnamed: offload is not a placement jax.checkpoint offers for untagged "
                "values; use remat (recompute them) or device (keep every intermediate)"
            )
        object.__setattr__(self, "unnamed", unnamed)
        object.__setattr__(
            self, "segments", tuple(sorted(self.segments, key=lambda s: (s.start, s.stop)))
        )

    def placement(self, name: str) -> Placement:
        return self.placements.get(name, self.default)


# The training state a plan places per layer group (the plan's ``state`` key), each ``device`` or
# ``offload`` (pinned host memory between steps).  Parameters outside the layer groups (embedding,
# final norm, head) and their moments stay on device.
STATE_KINDS = {
    "moments": "AdamW's first and second moments (mu, nu)",
    "master_weights": "the parameters in param_dtype (the float32 master weights)",
    "grad_accum": "the float32 gradient accumulator of a step with grad_accum > 1",
}
STATE_PLACEMENTS = (Placement.DEVICE, Placement.OFFLOAD)


def _state_placement(value: Any, where: str) -> Placement:
    """A state kind's placement: only :data:`STATE_PLACEMENTS` are offered, and only they named."""
    try:
        p = value if isinstance(value, Placement) else Placement(value)
    except ValueError:
        p = None
    if p not in STATE_PLACEMENTS:
        why = (
            " (it is not recomputed)"
            if p is Placement.REMAT
            else " (pinned host memory is 'offload')"
            if str(value).lower() in ("host", "pinned_host", "cpu")
            else ""
        )
        raise TieraxError(
            f"{where}: placement {getattr(p, 'value', value)!r} is not valid for training "
            f"state{why}; use one of: {', '.join(q.value for q in STATE_PLACEMENTS)}"
        )
    return p


@dataclass(frozen=True)
class StatePlacement:
    """Where one layer group's training state lives between steps (:data:`STATE_KINDS`)."""

    moments: Placement = Placement.DEVICE
    master_weights: Placement = Placement.DEVICE
    grad_accum: Placement = Placement.DEVICE

    def __post_init__(self) -> None:
        for kind in STATE_KINDS:
            object.__setattr__(
                self, kind, _state_placement(getattr(self, kind), f"plan state {kind}")
            )

    def placement(self, kind: str) -> Placement:
        return getattr(self, kind)

    @property
    def offloaded(self) -> tuple[str, ...]:
        """The kinds placed in host memory, in :data:`STATE_KINDS` order."""
        return tuple(k for k in STATE_KINDS if getattr(self, k) is Placement.OFFLOAD)

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k).value for k in STATE_KINDS}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> StatePlacement:
        if not isinstance(raw, Mapping):
            raise TieraxError(
                f"{where}: must map state kinds ({', '.join(STATE_KINDS)}) to device or offload"
            )
        unknown = sorted(str(k) for k in raw if k not in STATE_KINDS)
        if unknown:
            raise TieraxError(
                f"{where}: unknown state kind(s) {', '.join(unknown)}; valid kinds: "
                + ", ".join(f"{k} ({v})" for k, v in STATE_KINDS.items())
            )
        return cls(**{str(k): _state_placement(v, f"{where}, {k}") for k, v in raw.items()})


def _checked_state(raw: Mapping, where: str) -> MappingProxyType:
    out = {}
    for g, sp in dict(raw).items():
        if not isinstance(sp, StatePlacement):
            sp = StatePlacement.from_dict(sp, f"{where} group {g!r}")
        out[str(g)] = sp
    return MappingProxyType(out)


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
      state: layer group → :class:`StatePlacement` (where its moments, master weights and gradient
        accumulator live between steps); a group not listed keeps all of them on device.
      planned_for: what it was planned for (:class:`tierax.plan.planned_for.PlannedFor`: model,
        target, mesh, microbatch, seq, grad_accum, schedule); verbs that read the plan take these
        where their flags are not given and refuse flags that differ.
    """

    name: str
    groups: Mapping[str, GroupPlan]
    description: str = ""
    mechanism: str = DEFAULT_MECHANISM
    state: Mapping[str, StatePlacement] = field(default_factory=dict)
    planned_for: PlannedFor = field(default_factory=PlannedFor)

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "state", _checked_state(self.state, f"plan {self.name!r} state"))
        if not isinstance(self.planned_for, PlannedFor):
            object.__setattr__(
                self,
                "planned_for",
                PlannedFor.from_dict(self.planned_for, f"plan {self.name!r}"),
            )
        if self.mechanism not in MECHANISMS:
            raise TieraxError(
                f"plan {self.name!r}: mechanism {self.mechanism!r} is not valid; use one of: "
                + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items())
            )

    # What it was planned for (views of planned_for).
    mesh = property(lambda self: self.planned_for.mesh)
    microbatch = property(lambda self: self.planned_for.microbatch)
    grad_accum = property(lambda self: self.planned_for.grad_accum)

    # --- YAML / dict form -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        groups = {}
        for g, gp in self.groups.items():
            entry: dict[str, Any] = {"default": gp.default.value}
            if gp.unnamed is not Placement.REMAT:
                entry[UNNAMED] = gp.unnamed.value
            entry.update({n: p.value for n, p in gp.placements.items()})
            if gp.segments:
                entry["segments"] = [
                    {"layers": s.layers}
                    | ({UNNAMED: s.unnamed.value} if s.unnamed is not None else {})
                    | {n: p.value for n, p in s.placements.items()}
                    for s in gp.segments
                ]
            groups[g] = entry
        out = {"plan": self.name, "description": self.description}
        if self.mechanism != DEFAULT_MECHANISM:
            out["mechanism"] = self.mechanism
        if self.planned_for.to_dict():
            out["planned_for"] = self.planned_for.to_dict()
        out["groups"] = groups
        if self.state:
            out["state"] = {g: sp.to_dict() for g, sp in self.state.items()}
        return out

    def state_of(self, group: str) -> StatePlacement:
        """``group``'s state placements (all on device when the plan does not list it)."""
        return self.state.get(group, StatePlacement())

    @property
    def offloads_state(self) -> bool:
        return any(sp.offloaded for sp in self.state.values())

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> Plan:
        if not isinstance(data, Mapping):
            raise TieraxError(
                f"{source}: a plan must be a mapping with keys plan, description, groups"
            )
        unknown = set(data) - set(PLAN_KEYS) - set(LEGACY_KEYS)
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
            unnamed = Placement.parse(
                entry.pop(UNNAMED, Placement.REMAT), f"{source}: group {g!r} unnamed"
            )
            for n in entry:
                _check_name(n, f"{source}: group {g!r}")
            placements = {
                n: Placement.parse(p, f"{source}: group {g!r}, {n}") for n, p in entry.items()
            }
            try:
                groups[str(g)] = GroupPlan(placements, default, segments, unnamed)
            except TieraxError as e:
                raise TieraxError(f"{source}: group {g!r}: {e}") from None
        mechanism = data.get("mechanism", DEFAULT_MECHANISM)
        if mechanism not in MECHANISMS:
            raise TieraxError(
                f"{source}: mechanism {mechanism!r} is not valid; use one of: "
                + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items())
            )
        state_in = data.get("state") or {}
        if not isinstance(state_in, Mapping):
            raise TieraxError(
                f"{source}: 'state' must map layer group names to state placements, e.g. "
                "state: {decoder: {moments: offload}}"
            )
        return cls(
            str(data.get("plan", "custom")),
            groups,
            str(data.get("description", "") or ""),
            mechanism,
            _checked_state(state_in, f"{source}: state"),
            _planned_for(data, source),
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


PLAN_KEYS = ("plan", "description", "mechanism", "planned_for", "groups", "state")
# Keys of plan files written before ``planned_for`` (``plan --mesh auto``), read into it.
LEGACY_KEYS = ("mesh", "microbatch", "grad_accum")


def _planned_for(data: Mapping, source: str) -> PlannedFor:
    """A plan mapping's ``planned_for``, with the top-level ``mesh``, ``microbatch`` and
    ``grad_accum`` of older plan files read into it (both given: they must agree)."""
    planned = PlannedFor.from_dict(data.get("planned_for"), source)
    legacy = {k: data[k] for k in LEGACY_KEYS if data.get(k) is not None}
    if not legacy:
        return planned
    old = PlannedFor.from_dict(legacy, source)
    for k in legacy:
        if getattr(planned, k) is not None and getattr(planned, k) != getattr(old, k):
            raise TieraxError(
                f"{source}: top-level {k} {legacy[k]!r} differs from planned_for {k} "
                f"{getattr(planned, k)!r}; keep the one in planned_for"
            )
    return old.replace(**{k: v for k, v in planned.to_dict().items()})


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
        unnamed = seg.pop(UNNAMED, None)
        for n in seg:
            _check_name(n, f"{where}, segment {k}")
        out.append(
            Segment(
                start,
                last + 1,
                {n: Placement.parse(p, f"{where}, segment {k}, {n}") for n, p in seg.items()},
                None if unnamed is None else Placement.parse(unnamed, f"{where}, segment {k}"),
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
    for gname in plan.state:
        if gname not in groups:
            raise TieraxError(
                f"plan {plan.name!r}: state names layer group {gname!r}, which model "
                f"{cfg.name!r} does not have; its groups: {', '.join(groups)}"
            )
    for gname, gp in plan.groups.items():
        if gname not in groups:
            raise TieraxError(
                f"plan {plan.name!r} names layer group {gname!r}, which model {cfg.name!r} does "
                f"not have; its groups: {', '.join(groups)}"
            )
        named = list(gp.placements) + [n for s in gp.segments for n in s.placements]
        valid = groups[gname].activations
        missing = list(dict.fromkeys(n for n in named if n not in valid))
        if missing:
            close = [m for n in missing for m in difflib.get_close_matches(n, valid, n=1)]
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise TieraxError(
                f"plan {plan.name!r}, group {gname!r}: model {cfg.name!r} has no activation "
                f"{', '.join(map(repr, missing))}{hint}; valid names here: {', '.join(valid)}"
            )
        if gp.segments:
            _check_partition(gp, groups[gname].num_layers, f"plan {plan.name!r}, group {gname!r}")
    out = {}
    for gname, g in groups.items():
        gp = plan.groups.get(gname, GroupPlan())
        if not gp.segments:
            out[gname] = {n: gp.placement(n) for n in g.activations}
            _check_one_layer_group(plan, cfg, g.num_layers, out[gname], gname)
            _check_unnamed(plan, gp.unnamed, out[gname], gname)
        for s in gp.segments:
            where = segment_name(gname, s.start, s.stop)
            out[where] = {n: s.placements.get(n, gp.placement(n)) for n in g.activations}
            _check_runnable_segment(plan, s, out[where], where)
            _check_unnamed(plan, _segment_unnamed(gp, s), out[where], where)
    return out


def _check_unnamed(plan: Plan, unnamed: Placement, placements: Mapping[str, Placement], where: str):
    """``unnamed: device`` keeps every intermediate, so nothing named can be recomputed or moved."""
    if unnamed is not Placement.DEVICE:
        return
    other = sorted(n for n, p in placements.items() if p is not Placement.DEVICE)
    if other:
        raise TieraxError(
            f"plan {plan.name!r}, {where}: unnamed: device keeps every intermediate (no "
            f"rematerialisation), but {', '.join(other)} are not on device; put them on device "
            "or set unnamed: remat (the named placements, every untagged value recomputed)"
        )


def unnamed_placements(plan: Plan, cfg) -> dict[str, Placement]:
    """Each group of ``cfg`` (each segment, keyed as :func:`resolve` keys it) → the placement of
    its unnamed intermediates under ``plan`` (validated as :func:`resolve` validates)."""
    resolve(plan, cfg)
    out = {}
    for g in cfg.layer_groups():
        gp = plan.groups.get(g.name, GroupPlan())
        if not gp.segments:
            out[g.name] = gp.unnamed
        for s in gp.segments:
            out[segment_name(g.name, s.start, s.stop)] = _segment_unnamed(gp, s)
    return out


def _segment_unnamed(gp: GroupPlan, s: Segment) -> Placement:
    return gp.unnamed if s.unnamed is None else s.unnamed


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


def one_layer_offloads(num_layers: int, placements: Mapping[str, Placement], cfg) -> list[str]:
    """The names a group (or segment) of ``num_layers`` layers of ``cfg`` offloads that XLA would
    not keep in host memory: in tierax's own step every offloaded name of a single layer, none
    otherwise.  With one layer there is no layer loop: XLA removes the single-trip loop, and the
    value's store and its load back stay on device around the host copy (the load issued as soon as
    the store ends), under either mechanism; the value occupies device memory throughout, as if
    kept.  A program whose front end applies the plan by its own code
    (``one_layer_groups_offload``: MaxText's) is left to it: none."""
    if num_layers != 1 or getattr(cfg, "one_layer_groups_offload", False):
        return []
    return sorted(n for n, p in placements.items() if p is Placement.OFFLOAD)


def _check_one_layer_group(
    plan: Plan, cfg, num_layers: int, placements: Mapping[str, Placement], where: str
) -> None:
    """A one-layer group cannot offload (:func:`one_layer_offloads`); the planner never offloads
    there and the presets recompute such names instead (:func:`tierax.plan.presets.preset`)."""
    offload = one_layer_offloads(num_layers, placements, cfg)
    if offload:
        raise TieraxError(
            f"plan {plan.name!r}, group {where!r}: a one-layer group cannot offload "
            f"({', '.join(offload)}); XLA removes its single-trip layer loop and keeps the "
            "values on device around their host copies, so nothing is freed. Place them on "
            "device or remat in that group (tierax plan chooses only between those there)"
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
