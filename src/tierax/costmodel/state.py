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
* ``grad_accum``: the float32 accumulator of a step with ``A`` > 1 microbatches per update
  (:mod:`tierax.train.accumulate`).  On the device it holds ``P·4`` bytes through every
  microbatch's forward and backward; offloaded, those bytes leave the device (the update phase has
  none: the accumulator is the update's gradient by then), ``P·4`` host bytes, and the
  accumulation moves ``(A + 1)·P·4`` each way per step (a load and a store per microbatch, the
  final load, the zeros it starts from: XLA writes shared zero stacks once, so its compile can move
  less).  The copies overlap the additions of the same layer scan (``A·P·(8 + p)`` bytes of HBM
  traffic), each direction separately.  With one microbatch per update there is no accumulator:
  offloading it is refused.

Host memory (:func:`host_peak`): the streamed update writes each layer's new state into a second
host buffer (the scan's output, which becomes the donated state's after the step), so the host
holds the offloaded state twice at the end of the step; the offloaded activations are dead by then
and, on a GPU, share that memory.  Host bytes = ``state + max(offloaded activations, state)`` —
what XLA:GPU's deviceless compile reports: host arguments = the state, host temp = the larger of
the two (bench/results/state_offload.json).  XLA:TPU holds the second buffer beside the
activations' instead (host temp = activations + state:
:attr:`tierax.costmodel.rates.Rates.host_state_shares_activations`).  An offloaded accumulator is
live beside the offloaded activations through each microbatch, and twice (the layer scan's input
and output) while it is added to: host temp = ``max(activations + accumulator, 2 · accumulator,
state)``.

Hiding: the streamed update's copies of a group overlap that group's own update (its AdamW HBM
traffic at the device's HBM rate); the two directions run at the same time (the host link is full
duplex), so what is exposed is the slower direction's excess over the update.  Its
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
from tierax.tracing.program import Program

# Layers of an offloaded part's slices on the device during the streamed update: the layer being
# updated and the next one's loads (double buffering).
UPDATE_STAGING_LAYERS = 2
# The kinds the model prices (grad_accum only with more than one microbatch per update).
PRICED_KINDS = ("moments", "master_weights", "grad_accum")
# The kinds the step runs offloaded (tierax.train.streamed, tierax.train.accumulate): the ones the
# planner chooses, so that every plan it writes runs.
PLANNED_KINDS = ("moments", "master_weights", "grad_accum")
# The accumulator's dtype (tierax.train.accumulate sums in float32).
ACCUM_ITEMSIZE = 4
# The parts whose device bytes leave every phase; the accumulator's leave the microbatches' phases
# only (the update has none).
ALL_PHASE_KINDS = ("moments", "master_weights")


def planned_terms(
    prog: Program, rates: Rates, grad_accum: int = 1
) -> tuple[tuple[StateTerms, ...], tuple[StateGroupTerms, ...]]:
    """:func:`state_terms` of the parts the planner may place (:data:`PLANNED_KINDS`)."""
    items, groups = state_terms(prog, rates, grad_accum)
    return tuple(t for t in items if t.kind in PLANNED_KINDS), groups


def accumulate_s(prog: Program, rates: Rates, grad_accum: int) -> float:
    """The additions of ``grad_accum`` > 1 microbatches' gradients into the float32 accumulator,
    every parameter's, at the device's HBM rate (read the sum and the gradient, write the sum);
    0 for one microbatch per update."""
    if grad_accum < 2:
        return 0.0
    p_item = jnp.dtype(prog.param_dtype).itemsize
    count = prog.inventory.param_bytes / p_item
    return grad_accum * count * (2 * ACCUM_ITEMSIZE + p_item) / rates.hbm_bytes_per_s


def accumulator_bytes(prog: Program, grad_accum: int) -> int:
    """The float32 accumulator's bytes per device (every parameter's); 0 for one microbatch."""
    if grad_accum < 2:
        return 0
    return int(
        prog.inventory.param_bytes / jnp.dtype(prog.param_dtype).itemsize * ACCUM_ITEMSIZE
    )
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
    accumulate_device_s: float = 0.0  # the accumulator's additions: its copies' window


def _groups(inv: Inventory) -> dict[str, tuple[float, int]]:
    """Layer group (segments merged) → (parameters per device, layers)."""
    out: dict[str, tuple[float, int]] = {}
    for g in inv.groups:
        base = g.name.partition("@")[0]
        count, layers = out.get(base, (0.0, 0))
        out[base] = (count + inv.group_param_count(g.name), layers + g.num_layers)
    return out


def state_terms(
    prog: Program, rates: Rates, grad_accum: int = 1
) -> tuple[tuple[StateTerms, ...], tuple[StateGroupTerms, ...]]:
    """Every layer group's priced parts (:data:`PRICED_KINDS`; the accumulator only for
    ``grad_accum`` > 1 microbatches per update) and its update's times."""
    inv = prog.inventory
    p_item = jnp.dtype(prog.param_dtype).itemsize
    c_item = jnp.dtype(prog.dtype).itemsize
    m_item = inv.moment_bytes_per_param or 2 * p_item
    a_item = ACCUM_ITEMSIZE
    items, groups = [], []
    for name, (count, layers) in _groups(inv).items():
        update = hbm.optimizer_bytes(count * p_item)
        adds = grad_accum * count * (2 * a_item + p_item) if grad_accum > 1 else 0.0
        groups.append(
            StateGroupTerms(
                name,
                layers,
                update / rates.hbm_bytes_per_s,
                update / rates.host_memory_bytes_per_s if rates.host_memory_bytes_per_s else 0.0,
                adds / rates.hbm_bytes_per_s,
            )
        )
        kinds = [
            ("moments", count * m_item, count * m_item, count * m_item),
            ("master_weights", count * max(0, p_item - c_item), count * p_item, count * p_item),
        ]
        if grad_accum > 1:
            acc = count * a_item
            kinds.append(("grad_accum", acc, (grad_accum + 1) * acc, acc))
        for kind, freed, moved, host in kinds:
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
                    int(UPDATE_STAGING_LAYERS * host / max(layers, 1)),
                )
            )
    return tuple(items), tuple(groups)


def check_state(state: Mapping[str, StatePlacement], where: str, grad_accum: int = 1) -> None:
    """Refuse an offloaded accumulator with one microbatch per update, which has none.

    Raises:
      TieraxError: naming the groups and the two ways out.
    """
    bad = sorted(g for g, sp in state.items() if sp.grad_accum is Placement.OFFLOAD)
    if bad and grad_accum < 2:
        raise TieraxError(
            f"{where}: grad_accum: offload (group {', '.join(bad)}) places the gradient "
            f"accumulator of a step with several microbatches per update, but this step has "
            f"{grad_accum} microbatch per update, which accumulates nothing. Give --grad-accum N "
            f"(N > 1) or set grad_accum: device ({STATE_KINDS['grad_accum']})"
        )


@dataclass(frozen=True)
class StateCost:
    """What a plan's state placements add to a prediction (its ``breakdown.state``; built by
    :meth:`tierax.costmodel.linear_terms.LinearTerms.state_cost`)."""

    freed_bytes: int  # moments and master weights: from every phase
    host_bytes: int  # moments and master weights
    h2d_bytes: int
    d2h_bytes: int
    transfer_s: float
    exposed_s: float
    staging_bytes: int  # the streamed update's
    update_device_s: float
    update_host_s: float
    accum_freed_bytes: int = 0  # the accumulator's: from the microbatches' phases only
    accum_host_bytes: int = 0
    accum_staging_bytes: int = 0  # the accumulation's layer slices on the device

    def to_json(self) -> dict:
        return {key: getattr(self, f) for f, key in STATE_COST_KEYS.items()} | {
            "state_hidden_under_backward_s": 0.0,
            "state_mechanism": MECHANISM,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> StateCost:
        """The value :meth:`to_json` wrote (a prediction's ``breakdown``)."""
        return cls(**{f: d[key] for f, key in STATE_COST_KEYS.items()})


# StateCost's fields under their keys in a prediction's JSON breakdown.
STATE_COST_KEYS = {
    "freed_bytes": "state_freed_bytes",
    "host_bytes": "state_host_bytes",
    "h2d_bytes": "state_h2d_bytes",
    "d2h_bytes": "state_d2h_bytes",
    "transfer_s": "state_transfer_s",
    "exposed_s": "state_exposed_s",
    "staging_bytes": "state_update_staging_bytes",
    "update_device_s": "state_update_device_s",
    "update_host_s": "state_update_host_s",
    "accum_freed_bytes": "state_accum_freed_bytes",
    "accum_host_bytes": "state_accum_host_bytes",
    "accum_staging_bytes": "state_accum_staging_bytes",
}


def exposed(h2d_s: float, d2h_s: float, g: StateGroupTerms) -> float:
    """A group's streamed copies not hidden under its own update: the two directions run at once
    (the host link is full duplex), so the slower one's excess over the update is exposed."""
    return max(0.0, max(h2d_s, d2h_s) - g.update_device_s)


def accum_exposed(h2d_s: float, d2h_s: float, g: StateGroupTerms) -> float:
    """A group's accumulator copies not hidden under its additions: the slower direction's excess
    (the two run at once on the full-duplex link)."""
    return max(0.0, max(h2d_s, d2h_s) - g.accumulate_device_s)


def host_peak(
    activation_host_bytes: int,
    state_host_bytes: int,
    accum_host_bytes: int = 0,
    *,
    shares: bool = True,
) -> int:
    """Host bytes per device with ``state_host_bytes`` of offloaded training state and
    ``accum_host_bytes`` of offloaded accumulator beside ``activation_host_bytes`` of offloaded
    activations (module docstring: the update's second host buffer shares memory with the
    activations, which are dead by then; the accumulator is live beside them, and twice while it
    is added to).  ``shares`` False (XLA:TPU's host memory,
    :attr:`tierax.costmodel.rates.Rates.host_state_shares_activations`): the update's second
    buffer is held beside the activations' host buffers, not in them."""
    if not state_host_bytes and not accum_host_bytes:
        return int(activation_host_bytes)
    held = max(activation_host_bytes + accum_host_bytes, 2 * accum_host_bytes)
    temp = max(held, state_host_bytes) if shares else held + state_host_bytes
    return int(state_host_bytes + temp)


def offloaded_parts(state: Mapping[str, StatePlacement]) -> set[tuple[str, str]]:
    """The (group, kind) pairs a plan's ``state`` offloads."""
    return {(g, k) for g, sp in state.items() for k in sp.offloaded}
