"""A Plan turned into what each layer group runs (:func:`to_policies`): no remat, tierax's
prefetching or
segmented scan, or a ``jax.checkpoint`` policy."""

from __future__ import annotations

from collections.abc import Callable

import jax

from tierax import names as N
from tierax.models.decoder import Segments
from tierax.models.prefetch import Part, Prefetch
from tierax.plan.types import Placement, Plan, resolve, segments_of, unnamed_placements


def _group_policy(
    placements: dict[str, Placement], mechanism: str, unnamed: Placement
) -> Callable | Prefetch | None:
    if unnamed is Placement.DEVICE:  # every intermediate kept (resolve checked the names are)
        return None
    offload = frozenset(n for n, p in placements.items() if p is Placement.OFFLOAD)
    if mechanism == "prefetch" and offload and N.DECODER_LAYER_INPUT not in offload:
        # The layer input is the scan's own residual (always kept on device by the scan).
        keep = frozenset(n for n, p in placements.items() if p is Placement.DEVICE) - {
            N.DECODER_LAYER_INPUT
        }
        return Prefetch(keep, offload)
    # A layer input on device is the checkpointed body's input, saved as such; naming it too adds a
    # no-op
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[
            n
            for n, p in placements.items()  # reduce_precision copy (jax PR 22244)
            if p is Placement.DEVICE and n != N.DECODER_LAYER_INPUT
        ],
        names_which_can_be_offloaded=[n for n, p in placements.items() if p is Placement.OFFLOAD],
        offload_src="device",
        offload_dst="pinned_host",
    )


def _part(start: int, stop: int, placements: dict[str, Placement], unnamed: Placement) -> Part:
    """A segment as tierax's segmented scan runs it (it keeps, offloads and recomputes by name
    itself); :func:`~tierax.plan.types.resolve` has checked that the scan can run it."""
    keep = frozenset(n for n, p in placements.items() if p is Placement.DEVICE) - {
        N.DECODER_LAYER_INPUT
    }
    offload = frozenset(n for n, p in placements.items() if p is Placement.OFFLOAD)
    return Part(start, stop, keep, offload, save_all=unnamed is Placement.DEVICE)


def to_policies(plan: Plan, cfg) -> dict[str, Callable | Prefetch | Segments | None]:
    """THE function that turns a Plan into what each layer group runs.

    Returns:
      group → None where the group keeps its unnamed intermediates (``unnamed: device``: no
      remat; every name is then on device); a
      :class:`~tierax.models.prefetch.Prefetch` (tierax's prefetching layer scan) where the
      plan's mechanism is ``prefetch`` and the group offloads something other than its layer
      input; else a ``jax.checkpoint`` policy (``save_and_offload_only_these_names``: every
      untagged intermediate recomputed, also when every name is on device).  A
      segmented group gets :class:`~tierax.models.decoder.Segments`: one of those per segment.
    """
    resolved = resolve(plan, cfg)
    unnamed = unnamed_placements(plan, cfg)
    segmented = segments_of(plan, cfg)
    policies: dict[str, Callable | Prefetch | Segments | None] = {}
    for g in cfg.layer_groups():
        if g.name in segmented:
            parts = tuple(_part(a, b, resolved[v], unnamed[v]) for a, b, v in segmented[g.name])
            policies[g.name] = Segments(parts)
        else:
            policies[g.name] = _group_policy(resolved[g.name], plan.mechanism, unnamed[g.name])
    return policies
