"""The preset plans (one rule per preset, spelled out per layer group) and loading a plan by preset
name or
file."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from tierax import names as N
from tierax.errors import TieraxError
from tierax.plan.types import GroupPlan, Placement, Plan, resolve

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
    # save-all keeps the unnamed intermediates too (no remat); every other preset recomputes them
    unnamed = Placement.DEVICE if name == "save-all" else Placement.REMAT
    groups = {
        g.name: GroupPlan(rule(g.activations), Placement.REMAT, (), unnamed)
        for g in cfg.layer_groups()
    }
    return Plan(name, groups, desc)


def load_plan(spec: str | Plan, cfg) -> Plan:
    """A preset name or a path to a tierax plan YAML file, validated against ``cfg`` (MaxText
    overrides are read by :func:`tierax.interop.files.load_plan`)."""
    if isinstance(spec, Plan):
        plan = spec
    elif spec in PRESETS:
        plan = preset(spec, cfg)
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
