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

:func:`to_policies` is the only place a Plan becomes what a layer group runs: nothing (a group
whose ``unnamed: device`` keeps every intermediate: no remat, the ``save-all`` preset), tierax's
prefetching scan, or a ``jax.checkpoint`` policy (``save_and_offload_only_these_names``: the
named placements, every untagged intermediate recomputed — MaxText's ``custom`` semantics, also
when every name is on device).
"""

from tierax.plan.policies import to_policies
from tierax.plan.presets import PRESETS, load_plan, preset
from tierax.plan.types import (
    DEFAULT_MECHANISM,
    MECHANISMS,
    REFUSED_PRESETS,
    UNNAMED,
    GroupPlan,
    Placement,
    Plan,
    Segment,
    check_mechanism_preset,
    resolve,
    segment_name,
    segments_of,
    unnamed_placements,
)

__all__ = [
    "DEFAULT_MECHANISM",
    "MECHANISMS",
    "PRESETS",
    "REFUSED_PRESETS",
    "UNNAMED",
    "GroupPlan",
    "Placement",
    "Plan",
    "Segment",
    "check_mechanism_preset",
    "load_plan",
    "preset",
    "resolve",
    "segment_name",
    "segments_of",
    "to_policies",
    "unnamed_placements",
]
