"""A plan's training-state placements turned into shardings with memory kinds
(:func:`state_shardings`): the one place a ``state:`` entry becomes where a buffer lives."""

from __future__ import annotations

from typing import Any

from tierax.errors import TieraxError
from tierax.plan.types import STATE_KINDS, Placement, Plan

# JAX's memory kinds: offloaded state lives in page-locked host memory, which the device's copy
# engines read and write directly (JAX's "Memory spaces and host offloading" guide).
HOST_KIND = "pinned_host"
DEVICE_KIND = "device"


def layer_group_of(path) -> str | None:
    """The layer group a parameter-shaped leaf belongs to: the key after ``groups`` in its tree
    path (``['groups']['decoder']…``, also inside an optimizer state's ``mu`` / ``nu``); None for
    the embedding, the final norm and the head, whose state stays on device."""
    keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
    for a, b in zip(keys, keys[1:], strict=False):
        if a == "groups":
            return str(b)
    return None


def state_shardings(plan: Plan, shardings: Any, kind: str) -> Any:
    """``shardings`` (a pytree of NamedShardings of one part of the training state) with each
    leaf's memory kind set as ``plan`` places it: ``pinned_host`` for a leaf of a layer group whose
    ``kind`` is offloaded, ``device`` otherwise.

    Args:
      kind: which part the tree is — ``master_weights`` (the parameters: of an offloaded group,
        the leaves the model casts to the compute dtype before use go to the host, where a
        compute-dtype copy on the device stands in for them (:mod:`tierax.train.masters`); its
        norm scales, router and fp8 metas, used as they are, stay on the device), ``moments`` (the
        optimizer state: every leaf inside a layer group is a moment; the step counter is not) or
        ``grad_accum`` (the float32 gradient accumulator, parameter-shaped).

    Raises:
      TieraxError: ``kind`` is not one of :data:`tierax.plan.STATE_KINDS`.
    """
    if kind not in STATE_KINDS:
        raise TieraxError(f"state kind {kind!r} is not valid; use one of: {', '.join(STATE_KINDS)}")

    import jax  # here, not at import: `tierax plans` reads plans without JAX

    from tierax.models.layers import cast_before_use

    def placed(path, sharding):
        group = layer_group_of(path)
        offload = group is not None and plan.state_of(group).placement(kind) is Placement.OFFLOAD
        if kind == "master_weights":
            offload = offload and cast_before_use(path)
        return sharding.with_memory_kind(HOST_KIND if offload else DEVICE_KIND)

    return jax.tree_util.tree_map_with_path(placed, shardings)


def require_host_memory(plan: Plan, devices, where: str) -> None:
    """Refuse a plan that offloads training state onto devices whose memories lack
    ``pinned_host`` (a compile-only device lists none and passes).

    Raises:
      TieraxError: naming the devices' platform and the memory kinds they have.
    """
    if not plan.offloads_state:
        return
    device = next(iter(devices))
    kinds = [m.kind for m in device.addressable_memories()]
    # A deviceless topology's compile-only devices list no memories, yet XLA compiles pinned_host
    # placements for them (bench/results/state_offload.json): only a device that lists its
    # memories without pinned_host is refused.
    if kinds and HOST_KIND not in kinds:
        raise TieraxError(
            f"{where}: plan {plan.name!r} places training state in host memory, but "
            f"{device.platform} devices here have memory kinds {', '.join(kinds) or 'none'} (no "
            f"{HOST_KIND}); set its state to device (remove the plan's 'state' entries)"
        )
