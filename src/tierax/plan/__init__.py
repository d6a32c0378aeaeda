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
    state:                    # optional: the training state per layer group, device | offload
      decoder:
        moments: offload        # AdamW mu, nu in pinned host memory between steps
        master_weights: device
        grad_accum: device
    planned_for:              # what it was planned for (tierax.plan.planned_for); verbs read it
      model: tiny-llama
      target: h200
      mesh: {data: 1, fsdp: 8, tensor: 1, expert: 1}
      microbatch: 8
      seq: 4096
      grad_accum: 1
      schedule: lhs

:func:`to_policies` is the only place a Plan becomes what a layer group runs: nothing (a group
whose ``unnamed: device`` keeps every intermediate: no remat, the ``save-all`` preset), tierax's
prefetching scan, or a ``jax.checkpoint`` policy (``save_and_offload_only_these_names``: the
named placements, every untagged intermediate recomputed — MaxText's ``custom`` semantics, also
when every name is on device).
"""

from tierax.plan.planned_for import PlannedFor, merge_planned_for
from tierax.plan.presets import PRESETS, load_plan, preset
from tierax.plan.state import layer_group_of, require_host_memory, state_shardings
from tierax.plan.types import (
    DEFAULT_MECHANISM,
    MECHANISMS,
    REFUSED_PRESETS,
    STATE_KINDS,
    UNNAMED,
    GroupPlan,
    Placement,
    Plan,
    Segment,
    StatePlacement,
    check_mechanism_preset,
    is_segment,
    one_layer_offloads,
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
    "STATE_KINDS",
    "GroupPlan",
    "Placement",
    "Plan",
    "PlannedFor",
    "Segment",
    "StatePlacement",
    "check_mechanism_preset",
    "layer_group_of",
    "load_plan",
    "merge_planned_for",
    "one_layer_offloads",
    "preset",
    "require_host_memory",
    "resolve",
    "is_segment",
    "segment_name",
    "segments_of",
    "state_shardings",
    "to_policies",
    "unnamed_placements",
]


def __getattr__(name: str):
    # to_policies needs JAX: imported when first used, so reading and listing plans (`tierax
    # plans`) does not start it.
    if name == "to_policies":
        from tierax.plan.policies import to_policies

        return to_policies
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
