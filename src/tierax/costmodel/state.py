"""The training state's placements in the model (a plan's ``state:``): device bytes each offloaded
part frees, host bytes it takes, its transfers per step each way, and the update's time.

Mechanism (every target): offloaded state lives in pinned host memory between steps and the AdamW
update streams it layer by layer — one layer's state loaded, updated on the device, written back
while the next layer's loads — so the device holds at most two layers' slices of it
(:data:`UPDATE_STAGING_LAYERS`).  The update stays on the device because tierax's step runs Optax's
AdamW there; an update on the host (``compute_on("device_host")``) is not run by the step, and
:attr:`StateGroupTerms.update_host_s` gives what it would take at the host's memory bandwidth (the
hardware table's sourced figure) for comparison.

Per layer group with ``P`` parameters per device (as the step shards them), parameter dtype of
``p`` bytes, compute dtype of ``c`` bytes and AdamW moments of ``m`` bytes per parameter
(:func:`tierax.tracing.inventory.moment_bytes_per_param`):

* ``moments`` offloaded: ``P·m`` bytes leave the device (both peak phases hold them), ``P·m`` host
  bytes; the update reads them in (``P·m`` host→device) and writes them back (``P·m``
  device→host).
* ``master_weights`` offloaded: the float32 master copy lives on the host (``P·p`` host bytes) and
  the device keeps the weights in the compute dtype for the forward and backward, freeing
  ``P·(p − c)`` (nothing when the parameter dtype is the compute dtype); the update reads the
  masters in and writes them back (``P·p`` each way).  The step keeps the few parameters the
  model uses in float32 (norm scales, the MoE router: :func:`tierax.models.layers.
  cast_before_use`) on the device; ``P`` counts them too, a small overcount of the host bytes.
* ``grad_accum``: the float32 accumulator of a step with more than one microbatch per update.  The
  model (simulate, plan) prices one microbatch per update, which has no accumulator: offloading it
  is refused there rather than priced as free.

Host memory (:func:`host_peak`): the streamed update writes each layer's new state into a second
host buffer (the scan's output, which becomes the donated state's after the step), so the host
holds the offloaded state twice at the end of the step; the offloaded activations are dead by then
and share that memory.  Host bytes = ``state + max(offloaded activations, state)`` — what XLA's
deviceless compile reports: host arguments = the state, host temp = the larger of the two
(bench/results/state_offload.json).

Hiding: the streamed update's copies of a group overlap that group's own update (its AdamW HBM
traffic at the device's HBM rate), each direction separately (the host link is full duplex).  Its
hidden share under the backward pass is 0: the update starts after the last gradient, and loading
a layer's state during the backward would hold it in device memory through the backward's peak,
which is what offloading it frees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import jax.numpy as jnp

from tierax.costmodel.rates import Rates
from tierax.errors import TieraxError
from tierax.plan import STATE_KINDS, Placement, StatePlacement
from tierax.tracing import hbm
from tierax.tracing.inventory import Inventory

# Layers of an offloaded part's slices on the device during the streamed update: the layer being
# updated and the next one's loads (double buffering).
UPDATE_STAGING_LAYERS = 2
# The kinds the model prices (grad_accum: see the module docstring).
PRICED_KINDS = ("moments", "master_weights")
# The kinds the step runs offloaded (tierax.train.streamed): the only ones the planner chooses, so
# that every plan it writes runs.
PLANNED_KINDS = ("moments", "master_weights")


def planned_terms(
    inv: Inventory, cfg, rates: Rates
) -> tuple[tuple[StateTerms, ...], tuple[StateGroupTerms, ...]]:
    """:func:`state_terms` of the parts the planner may place (:data:`PLANNED_KINDS`)."""
    items, groups = state_terms(inv, cfg, rates)
    return tuple(t for t in items if t.kind in PLANNED_KINDS), groups
# Where each part's update runs and why (reported with a plan's prediction).
MECHANISM = (
    "streamed: pinned host memory between steps, loaded layer by layer for the AdamW update on the "
    "device and written back; the step runs Optax's update on the device"
)


@dataclass(frozen=True)
class StateTerms:
    """One layer group's part of the training state, per device."""

    group: str
    kind: str
    device_bytes: int  # freed from every peak phase when offloaded
    host_bytes: int  # taken in host memory when offloaded
    h2d_bytes: int  # per step, when offloaded
    d2h_bytes: int
    h2d_s: float
    d2h_s: float
    staging_bytes: int  # on the device during the streamed update (UPDATE_STAGING_LAYERS)


@dataclass(frozen=True)
class StateGroupTerms:
    """The AdamW update of one layer group, per device."""

    group: str
    num_layers: int
    update_device_s: float  # at the device's HBM rate: the window the streamed copies hide in
    update_host_s: float  # at the host's memory bandwidth (0: the target's is not known)


def _groups(inv: Inventory) -> dict[str, tuple[float, int]]:
    """Layer group (segments merged) → (parameters per device, layers)."""
    out: dict[str, tuple[float, int]] = {}
    for g in inv.groups:
        base = g.name.partition("@")[0]
        count, layers = out.get(base, (0.0, 0))
        out[base] = (count + inv.group_param_count(g.name), layers + g.num_layers)
    return out


def state_terms(
    inv: Inventory, cfg, rates: Rates
) -> tuple[tuple[StateTerms, ...], tuple[StateGroupTerms, ...]]:
    """Every layer group's priced parts (:data:`PRICED_KINDS`) and its update's times."""
    p_item = jnp.dtype(cfg.param_dtype).itemsize
    c_item = jnp.dtype(cfg.dtype).itemsize
    m_item = inv.moment_bytes_per_param or 2 * p_item
    items, groups = [], []
    for name, (count, layers) in _groups(inv).items():
        update = hbm.optimizer_bytes(count * p_item)
        groups.append(
            StateGroupTerms(
                name,
                layers,
                update / rates.hbm_bytes_per_s,
                update / rates.host_memory_bytes_per_s if rates.host_memory_bytes_per_s else 0.0,
            )
        )
        for kind, freed, moved in (
            ("moments", count * m_item, count * m_item),
            ("master_weights", count * max(0, p_item - c_item), count * p_item),
        ):
            host = count * (m_item if kind == "moments" else p_item)
            if not rates.offload_is_real:  # XLA:CPU: host and device memory are the same DRAM
                freed = host = moved = 0
            items.append(
                StateTerms(
                    name,
                    kind,
                    int(freed),
                    int(host),
                    int(moved),
                    int(moved),
                    moved / rates.h2d_bytes_per_s,
                    moved / rates.d2h_bytes_per_s,
                    int(UPDATE_STAGING_LAYERS * moved / max(layers, 1)),
                )
            )
    return tuple(items), tuple(groups)


def check_state(state: Mapping[str, StatePlacement], where: str) -> None:
    """Refuse placements the model cannot price (``grad_accum: offload``, see the docstring)."""
    bad = sorted(g for g, sp in state.items() if sp.grad_accum is Placement.OFFLOAD)
    if bad:
        raise TieraxError(
            f"{where}: grad_accum: offload (group {', '.join(bad)}) places the gradient "
            f"accumulator of a step with several microbatches per update; the cost model prices "
            f"one microbatch per update, which has none. Set grad_accum: device there "
            f"({STATE_KINDS['grad_accum']})"
        )


@dataclass(frozen=True)
class StateCost:
    """What a plan's state placements add to a prediction."""

    freed_bytes: int
    host_bytes: int
    h2d_bytes: int
    d2h_bytes: int
    transfer_s: float
    exposed_s: float
    staging_bytes: int
    update_device_s: float
    update_host_s: float

    def to_json(self) -> dict:
        return {
            "state_freed_bytes": self.freed_bytes,
            "state_host_bytes": self.host_bytes,
            "state_h2d_bytes": self.h2d_bytes,
            "state_d2h_bytes": self.d2h_bytes,
            "state_transfer_s": self.transfer_s,
            "state_exposed_s": self.exposed_s,
            "state_hidden_under_backward_s": 0.0,
            "state_update_staging_bytes": self.staging_bytes,
            "state_update_device_s": self.update_device_s,
            "state_update_host_s": self.update_host_s,
            "state_mechanism": MECHANISM,
        }


def exposed(h2d_s: float, d2h_s: float, g: StateGroupTerms) -> float:
    """A group's streamed copies not hidden under its own update, each direction on its own."""
    return max(0.0, h2d_s - g.update_device_s) + max(0.0, d2h_s - g.update_device_s)


def state_cost(offloaded: set[tuple[str, str]], inv: Inventory, cfg, rates: Rates) -> StateCost:
    """The cost of offloading the (group, kind) pairs in ``offloaded`` (every other part on
    device)."""
    items, groups = state_terms(inv, cfg, rates)
    freed = host = h2d = d2h = staging = 0
    transfer = exp = 0.0
    for g in groups:
        mine = [i for i in items if i.group == g.group and (i.group, i.kind) in offloaded]
        freed += sum(i.device_bytes for i in mine)
        host += sum(i.host_bytes for i in mine)
        h2d += sum(i.h2d_bytes for i in mine)
        d2h += sum(i.d2h_bytes for i in mine)
        up, down = sum(i.h2d_s for i in mine), sum(i.d2h_s for i in mine)
        transfer += up + down
        if rates.offload_is_real:
            exp += exposed(up, down, g)
        staging = max(staging, sum(i.staging_bytes for i in mine))
    return StateCost(
        freed,
        host,
        h2d,
        d2h,
        transfer,
        exp,
        staging if rates.offload_is_real else 0,
        sum(g.update_device_s for g in groups),
        sum(g.update_host_s for g in groups),
    )


def host_peak(activation_host_bytes: int, state_host_bytes: int) -> int:
    """Host bytes per device with ``state_host_bytes`` of offloaded training state beside
    ``activation_host_bytes`` of offloaded activations (module docstring: the update's second
    host buffer shares memory with the activations)."""
    if not state_host_bytes:
        return int(activation_host_bytes)
    return int(state_host_bytes + max(activation_host_bytes, state_host_bytes))


def offloaded_parts(state: Mapping[str, StatePlacement]) -> set[tuple[str, str]]:
    """The (group, kind) pairs a plan's ``state`` offloads."""
    return {(g, k) for g, sp in state.items() for k in sp.offloaded}
