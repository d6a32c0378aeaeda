"""Plans: where each activation lives between the forward and the backward pass.

A :class:`Plan` maps, for each layer group, each activation name to a
:class:`Placement` — kept in device memory, offloaded to pinned host memory, or
recomputed.  It is a frozen value with a YAML form::

    plan: qkv-offload
    description: q/k/v projections offloaded, the rest recomputed
    groups:
      decoder:
        default: remat          # names not listed below
        decoder_layer_input: device
        query_proj: offload
        key_proj: offload
        value_proj: offload

:func:`to_policies` is the only place a Plan becomes what a layer group runs: nothing (every
activation on device: no remat), tierax's prefetching scan, or a ``jax.checkpoint`` policy
(``save_and_offload_only_these_names``; unnamed intermediates are recomputed).
"""

from __future__ import annotations

import enum
import pathlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jax
import yaml

from tierax import names as N
from tierax.errors import TieraxError
from tierax.interop import maxtext_keys
from tierax.models.decoder import Segments
from tierax.models.prefetch import Part, Prefetch


class Placement(str, enum.Enum):
    DEVICE = "device"
    OFFLOAD = "offload"
    REMAT = "remat"

    @classmethod
    def parse(cls, value: Any, where: str) -> "Placement":
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
    """Layers ``start`` … ``stop − 1`` of a group, whose placements override the group's for these layers."""
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
        object.__setattr__(self, "segments", tuple(sorted(self.segments, key=lambda s: (s.start, s.stop))))

    def placement(self, name: str) -> Placement:
        return self.placements.get(name, self.default)


# How offloaded activations move between the passes (the plan's ``mechanism`` key).
MECHANISMS = {
    "prefetch": "tierax's layer scan: stores as produced, loads one layer ahead of their use",
    "policy": "XLA's host offloader under jax.checkpoint's offload policy: loads in the layer that uses them",
}
DEFAULT_MECHANISM = "prefetch"


@dataclass(frozen=True)
class Plan:
    """A placement for every activation of every layer group.

    Attributes:
      name: a label (preset name or file stem).
      groups: layer group name → :class:`GroupPlan`.
      description: one line for humans.
    """

    name: str
    groups: Mapping[str, GroupPlan]
    description: str = ""
    mechanism: str = DEFAULT_MECHANISM

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        if self.mechanism not in MECHANISMS:
            raise TieraxError(f"plan {self.name!r}: mechanism {self.mechanism!r} is not valid; use one of: "
                              + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items()))

    # --- YAML / dict form -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        groups = {}
        for g, gp in self.groups.items():
            entry: dict[str, Any] = {"default": gp.default.value}
            entry.update({n: p.value for n, p in gp.placements.items()})
            if gp.segments:
                entry["segments"] = [{"layers": s.layers} | {n: p.value for n, p in s.placements.items()}
                                     for s in gp.segments]
            groups[g] = entry
        out = {"plan": self.name, "description": self.description}
        if self.mechanism != DEFAULT_MECHANISM:
            out["mechanism"] = self.mechanism
        return out | {"groups": groups}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "plan") -> "Plan":
        if not isinstance(data, Mapping):
            raise TieraxError(f"{source}: a plan must be a mapping with keys plan, description, groups")
        unknown = set(data) - {"plan", "description", "mechanism", "groups"}
        if unknown:
            raise TieraxError(
                f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                "a plan has keys: plan, description, mechanism, groups"
            )
        groups_in = data.get("groups")
        if not isinstance(groups_in, Mapping) or not groups_in:
            raise TieraxError(f"{source}: 'groups' must map layer group names to placements")
        groups = {}
        for g, entry in groups_in.items():
            if not isinstance(entry, Mapping):
                raise TieraxError(f"{source}: group {g!r} must map activation names to placements")
            entry = dict(entry)
            default = Placement.parse(entry.pop("default", Placement.REMAT), f"{source}: group {g!r} default")
            segments = _parse_segments(entry.pop("segments", None), f"{source}: group {g!r}")
            for n in entry:
                _check_name(n, f"{source}: group {g!r}")
            placements = {n: Placement.parse(p, f"{source}: group {g!r}, {n}") for n, p in entry.items()}
            groups[str(g)] = GroupPlan(placements, default, segments)
        mechanism = data.get("mechanism", DEFAULT_MECHANISM)
        if mechanism not in MECHANISMS:
            raise TieraxError(f"{source}: mechanism {mechanism!r} is not valid; use one of: "
                              + ", ".join(f"{k} ({v})" for k, v in MECHANISMS.items()))
        return cls(str(data.get("plan", "custom")), groups, str(data.get("description", "") or ""), mechanism)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "plan") -> "Plan":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise TieraxError(f"{source}: not valid YAML ({e})") from None
        return cls.from_dict(data, source=source)


def _parse_segments(raw: Any, where: str) -> tuple[Segment, ...]:
    """``segments: [{layers: "0-23", query_proj: offload, ...}, ...]`` (layer ranges inclusive)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise TieraxError(f"{where}: 'segments' must be a list of mappings, each with 'layers: A-B' and placements")
    out = []
    for k, seg in enumerate(raw):
        if not isinstance(seg, Mapping) or "layers" not in seg:
            raise TieraxError(f"{where}, segment {k}: give 'layers: A-B' (inclusive layer indices) and placements")
        seg = dict(seg)
        layers = str(seg.pop("layers")).replace(" ", "")
        a, sep, b = layers.partition("-")
        if not (a.isdigit() and (not sep or b.isdigit())):
            raise TieraxError(f"{where}, segment {k}: layers {layers!r} is not a range like '0-23' or one layer '7'")
        start, last = int(a), int(b) if sep else int(a)
        if last < start:
            raise TieraxError(f"{where}, segment {k}: layers {layers!r} ends before it starts")
        if "default" in seg:
            raise TieraxError(f"{where}, segment {k}: a segment overrides named placements only; set 'default' on "
                              "the group")
        for n in seg:
            _check_name(n, f"{where}, segment {k}")
        out.append(Segment(start, last + 1, {n: Placement.parse(p, f"{where}, segment {k}, {n}") for n, p in seg.items()}))
    return tuple(out)


def _check_partition(gp: GroupPlan, num_layers: int, where: str) -> None:
    """The segments cover layers 0 … num_layers − 1, each exactly once."""
    covered = [0] * num_layers
    for s in gp.segments:
        if s.stop > num_layers:
            raise TieraxError(f"{where}: segment {s.layers} goes past the group's last layer ({num_layers - 1})")
        for i in range(s.start, s.stop):
            covered[i] += 1
    for bad, what in (([i for i, c in enumerate(covered) if c > 1], "more than one segment"),
                      ([i for i, c in enumerate(covered) if c == 0], "no segment")):
        if bad:
            raise TieraxError(f"{where}: layer(s) {', '.join(map(str, bad))} in {what}; segments must cover layers "
                              f"0-{num_layers - 1} exactly once")


# --- presets ----------------------------------------------------------------

_QKV = (N.QUERY_PROJ, N.KEY_PROJ, N.VALUE_PROJ)


def _rule_save_all(acts: tuple[str, ...]) -> dict[str, Placement]:
    return {n: Placement.DEVICE for n in acts}


def _rule_remat_full(acts: tuple[str, ...]) -> dict[str, Placement]:
    return {n: Placement.DEVICE if n == N.DECODER_LAYER_INPUT else Placement.REMAT for n in acts}


def _rule_minimal(acts: tuple[str, ...]) -> dict[str, Placement]:
    keep = N.PROJECTION_NAMES | {N.DECODER_LAYER_INPUT}
    return {n: Placement.DEVICE if n in keep else Placement.REMAT for n in acts}


def _rule_qkv_offload(acts: tuple[str, ...]) -> dict[str, Placement]:
    out = _rule_remat_full(acts)
    out.update({n: Placement.OFFLOAD for n in _QKV if n in acts})
    return out


def _rule_deepseek_offload(acts: tuple[str, ...]) -> dict[str, Placement]:
    out = _rule_qkv_offload(acts)
    is_moe = N.MOE_MLPWI_0 in acts
    up = (N.MOE_MLPWI_0, N.MOE_MLPWI_1) if is_moe else (N.MLPWI_0, N.MLPWI_1)
    out.update({n: Placement.OFFLOAD for n in up if n in acts})
    return out


PRESETS: dict[str, tuple[str, Callable[[tuple[str, ...]], dict[str, Placement]]]] = {
    "save-all": ("every activation kept on device; no rematerialisation", _rule_save_all),
    "remat-full": ("only the layer input kept; everything else recomputed", _rule_remat_full),
    "minimal": ("weight-projection outputs kept on device; the rest recomputed", _rule_minimal),
    "qkv-offload": ("q/k/v projections offloaded to host; the rest recomputed", _rule_qkv_offload),
    "deepseek-offload": (
        "q/k/v and MLP up-projections (routed experts in MoE groups, the dense MLP elsewhere) "
        "offloaded; the rest recomputed",
        _rule_deepseek_offload,
    ),
}


def preset(name: str, cfg) -> Plan:
    """The preset ``name`` spelled out for every layer group of ``cfg``."""
    if name not in PRESETS:
        raise TieraxError(f"unknown plan preset {name!r}; presets: {', '.join(PRESETS)}")
    desc, rule = PRESETS[name]
    groups = {g.name: GroupPlan(rule(g.activations), Placement.REMAT) for g in cfg.layer_groups()}
    return Plan(name, groups, desc)


def load_plan(spec: str | Plan, cfg) -> Plan:
    """A preset name or a path to a plan YAML file, validated against ``cfg``."""
    if isinstance(spec, Plan):
        plan = spec
    elif spec in PRESETS:
        plan = preset(spec, cfg)
    else:
        path = pathlib.Path(spec)
        if not path.is_file():
            raise TieraxError(
                f"plan {spec!r} is neither a preset ({', '.join(PRESETS)}) nor an existing YAML file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TieraxError(f"plan file {spec!r} is not UTF-8 text ({e.reason} at byte {e.start}); give a plan "
                              "YAML file such as `tierax plans --show minimal --yaml` prints") from None
        plan = _from_file_text(text, str(path), cfg)
    resolve(plan, cfg)
    return plan


def _from_file_text(text: str, source: str, cfg) -> Plan:
    """A tierax plan file, or MaxText overrides (``remat_policy: custom``, as ``--emit maxtext`` writes)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None  # from_yaml reports it
    if maxtext_keys.is_override_file(data):
        groups = {g.name: g.activations for g in cfg.layer_groups()}
        return Plan.from_dict(maxtext_keys.plan_dict(data, groups, source=source, text=text), source=source)
    return Plan.from_yaml(text, source=source)


def resolve(plan: Plan, cfg) -> dict[str, dict[str, Placement]]:
    """Every (group, activation) of ``cfg`` → its placement under ``plan``; a segmented group gives one
    entry per segment, keyed by :func:`segment_name` (``decoder@0-23``), in layer order.

    Raises:
      TieraxError: the plan names a group or an activation the model lacks, or a group's segments do
        not cover its layers exactly once.
    """
    groups = {g.name: g for g in cfg.layer_groups()}
    for gname, gp in plan.groups.items():
        if gname not in groups:
            raise TieraxError(
                f"plan {plan.name!r} names layer group {gname!r}, which model {cfg.name!r} does not have; "
                f"its groups: {', '.join(groups)}"
            )
        named = list(gp.placements) + [n for s in gp.segments for n in s.placements]
        missing = list(dict.fromkeys(n for n in named if n not in groups[gname].activations))
        if missing:
            raise TieraxError(
                f"plan {plan.name!r}, group {gname!r}: model {cfg.name!r} has no activation "
                f"{', '.join(map(repr, missing))}; valid names here: {', '.join(groups[gname].activations)}"
            )
        if gp.segments:
            _check_partition(gp, groups[gname].num_layers, f"plan {plan.name!r}, group {gname!r}")
    out = {}
    for gname, g in groups.items():
        gp = plan.groups.get(gname, GroupPlan())
        if not gp.segments:
            out[gname] = {n: gp.placement(n) for n in g.activations}
        for s in gp.segments:
            out[segment_name(gname, s.start, s.stop)] = {n: s.placements.get(n, gp.placement(n)) for n in g.activations}
    return out


def segments_of(plan: Plan, cfg) -> dict[str, list[tuple[int, int, str]]]:
    """Segmented groups only: group → [(start, stop, segment name)] in layer order (validated)."""
    resolve(plan, cfg)
    return {g: [(s.start, s.stop, segment_name(g, s.start, s.stop)) for s in gp.segments]
            for g, gp in plan.groups.items() if gp.segments}


def _group_policy(placements: dict[str, Placement], mechanism: str) -> Callable | Prefetch | None:
    if all(p is Placement.DEVICE for p in placements.values()):
        return None
    offload = frozenset(n for n, p in placements.items() if p is Placement.OFFLOAD)
    if mechanism == "prefetch" and offload and N.DECODER_LAYER_INPUT not in offload:
        # The layer input is the scan's own residual (always kept on device by the scan).
        keep = frozenset(n for n, p in placements.items() if p is Placement.DEVICE) - {N.DECODER_LAYER_INPUT}
        return Prefetch(keep, offload)
    # A layer input on device is the checkpointed body's input, saved as such; naming it too adds a no-op
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[n for n, p in placements.items()  # reduce_precision copy (jax PR 22244)
                                  if p is Placement.DEVICE and n != N.DECODER_LAYER_INPUT],
        names_which_can_be_offloaded=[n for n, p in placements.items() if p is Placement.OFFLOAD],
        offload_src="device",
        offload_dst="pinned_host",
    )


def _part(start: int, stop: int, placements: dict[str, Placement], plan: Plan, where: str) -> Part:
    """A segment as tierax's segmented scan runs it (it keeps, offloads and recomputes by name itself)."""
    if plan.mechanism != "prefetch":
        raise TieraxError(f"plan {plan.name!r} has segments, which run in tierax's segmented scan (mechanism "
                          f"prefetch); mechanism {plan.mechanism!r} applies to unsegmented plans only")
    if placements.get(N.DECODER_LAYER_INPUT) is Placement.OFFLOAD:
        raise TieraxError(f"plan {plan.name!r}, {where}: a segment keeps decoder_layer_input on device (the scan's "
                          "own residual); offload it only in an unsegmented plan with mechanism: policy")
    keep = frozenset(n for n, p in placements.items() if p is Placement.DEVICE) - {N.DECODER_LAYER_INPUT}
    offload = frozenset(n for n, p in placements.items() if p is Placement.OFFLOAD)
    if offload and stop - start == 1:  # XLA drops a host round trip that no loop separates
        raise TieraxError(f"plan {plan.name!r}, {where}: a one-layer segment cannot offload ({', '.join(sorted(offload))}"
                          "); XLA removes the host copy there. Make the segment at least 2 layers")
    return Part(start, stop, keep, offload, save_all=all(p is Placement.DEVICE for p in placements.values()))


def to_policies(plan: Plan, cfg) -> dict[str, Callable | Prefetch | Segments | None]:
    """THE function that turns a Plan into what each layer group runs.

    Returns:
      group → None where every activation is on device (no remat); a
      :class:`~tierax.models.prefetch.Prefetch` (tierax's prefetching layer scan) where the
      plan's mechanism is ``prefetch`` and the group offloads something other than its layer
      input; else a ``jax.checkpoint`` policy (``save_and_offload_only_these_names``).  A
      segmented group gets :class:`~tierax.models.decoder.Segments`: one of those per segment.
    """
    resolved = resolve(plan, cfg)
    segmented = segments_of(plan, cfg)
    policies: dict[str, Callable | Prefetch | Segments | None] = {}
    for g in cfg.layer_groups():
        if g.name in segmented:
            policies[g.name] = Segments(tuple(_part(a, b, resolved[v], plan, v) for a, b, v in segmented[g.name]))
        else:
            policies[g.name] = _group_policy(resolved[g.name], plan.mechanism)
    return policies
