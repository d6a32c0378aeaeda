"""The preset plans (one rule per preset, spelled out per layer group) and loading a plan by preset
name or
file."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable

from tierax import names as N
from tierax.errors import TieraxError
from tierax.plan.types import GroupPlan, Placement, Plan, one_layer_offloads, resolve

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


def _rule_for(rule, g, cfg) -> tuple[dict[str, Placement], list[str]]:
    """``rule`` applied to layer group ``g`` of ``cfg``: (placements, the names it would offload
    that are recomputed instead).  A one-layer group of tierax's own step cannot offload
    (:func:`tierax.plan.one_layer_offloads`): there the preset recomputes what it offloads
    elsewhere, as it recomputes what it does not keep; a program whose front end applies the plan
    itself (``one_layer_groups_offload``: MaxText's) keeps the preset's placements."""
    placements = rule(g.activations)
    dropped = one_layer_offloads(g.num_layers, placements, cfg)
    return placements | {n: Placement.REMAT for n in dropped}, dropped


def one_layer_notes(name: str, cfg) -> list[str]:
    """What preset ``name`` recomputes instead of offloading in ``cfg``'s one-layer groups, one
    line per such group (none for a preset that offloads nothing there, or another plan)."""
    if name not in PRESETS:
        return []
    return [
        f"note: preset {name!r}: layer group {g.name!r} has one layer, where XLA keeps an "
        f"offloaded value on device; {', '.join(dropped)} recomputed there instead (remat)"
        for g in cfg.layer_groups()
        if (dropped := _rule_for(PRESETS[name][1], g, cfg)[1])
    ]


def preset(name: str, cfg) -> Plan:
    """The preset ``name`` spelled out for every layer group of ``cfg``; in a one-layer group the
    names it offloads elsewhere are recomputed (:func:`one_layer_notes`), which its description
    says."""
    if name not in PRESETS:
        raise TieraxError(f"unknown plan preset {name!r}; presets: {', '.join(PRESETS)}")
    desc, rule = PRESETS[name]
    # save-all keeps the unnamed intermediates too (no remat); every other preset recomputes them
    unnamed = Placement.DEVICE if name == "save-all" else Placement.REMAT
    groups, recomputed = {}, []
    for g in cfg.layer_groups():
        placements, dropped = _rule_for(rule, g, cfg)
        groups[g.name] = GroupPlan(placements, Placement.REMAT, (), unnamed)
        if dropped:
            recomputed.append(g.name)
    if recomputed:
        desc += (
            f"; in one-layer group{'s' if len(recomputed) > 1 else ''} "
            f"{', '.join(recomputed)}: recomputed, not offloaded"
        )
    return Plan(name, groups, desc)


def load_plan(spec: str | Plan, cfg) -> Plan:
    """A preset name or a path to a tierax plan YAML file, validated against ``cfg`` (MaxText
    overrides are read by :func:`tierax.interop.files.load_plan`)."""
    if isinstance(spec, Plan):
        plan = spec
    elif spec in PRESETS:
        plan = preset(spec, cfg)
        for note in one_layer_notes(spec, cfg):
            print(note, file=sys.stderr)
    else:
        path = pathlib.Path(spec)
        if not path.is_file():
            raise TieraxError(
                f"plan {spec!r} is neither a preset ({', '.join(PRESETS)}) nor an existing YAML "
                f"file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TieraxError(
                f"plan file {spec!r} is not UTF-8 text ({e.reason} at byte {e.start}); give a plan "
                "YAML file such as `tierax plans --show minimal --yaml` prints"
            ) from None
        plan = Plan.from_yaml(text, source=str(path))
    resolve(plan, cfg)
    return plan
