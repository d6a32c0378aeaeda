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

from tierax.plan.presets import PRESETS, load_plan, preset
from tierax.plan.types import (
    DEFAULT_MECHANISM,
    MECHANISMS,
    REFUSED_PRESETS,
    GroupPlan,
    Placement,
    Plan,
    Segment,
    check_mechanism_preset,
    resolve,
    segment_name,
    segments_of,
)

__all__ = [
    "DEFAULT_MECHANISM",
    "MECHANISMS",
    "PRESETS",
    "REFUSED_PRESETS",
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
]


def __getattr__(name: str):
    # to_policies needs JAX: imported when first used, so reading and listing plans (`tierax
    # plans`) does not start it.
    if name == "to_policies":
        from tierax.plan.policies import to_policies

        return to_policies
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
