"""Per-activation and per-group terms of the model (bytes, recompute, transfer and compute seconds),
with
the staging and overlap each schedule and mechanism allows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel import network
from tierax.costmodel.rates import Rates, fused_attention_s, indexed_s, matmul_s
from tierax.models.prefetch import host_slots, stored_in_own_layer
from tierax.tracing.inventory import Inventory

SCHEDULES = ("serial", "lhs", "lhs-pipelined")
STAGING_LAYERS = {"serial": 1, "lhs": 1, "lhs-pipelined": 2}
OVERLAP_WINDOW = {"serial": 0.0, "lhs": 0.5, "lhs-pipelined": 1.0}


def staging_and_window(schedule: str, mechanism: str) -> tuple[int, float]:
    """(layers of offloaded residuals staged on device, share of a layer's compute a copy can hide
    under).

    ``policy`` (XLA's host offloader): as the schedule allows.  ``prefetch`` (tierax's scan): a
    store overlaps the rest of the forward, a load the whole backward of the layer before its use,
    so a whole layer unless serial; one layer staged, the one arriving: the layer in use's loaded
    slices are its residuals, already in the workspace (its save-all residual set).  XLA's peak, in
    a layer's backward, holds those and the next one's prefetched slices (two layers overstated
    DeepSeek-V3 deepseek-offload by +9.3 %, 5 layers by +3.6 %).
    """
    if mechanism == "prefetch":
        return 1, (0.0 if schedule == "serial" else 1.0)
    return STAGING_LAYERS[schedule], OVERLAP_WINDOW[schedule]


def offload_host_bytes(
    group: str, name: str, held_per_layer: int, layers: int, mechanism: str
) -> int:
    """Host bytes of offloaded ``name`` of ``group`` (``held_per_layer`` bytes a layer).

    ``prefetch`` on a whole group (:func:`tierax.models.prefetch.prefetch_scan`): its host stack
    (:func:`tierax.models.prefetch.host_slots`: a value stored a layer later keeps its last layer
    on device, the staged layer the backward starts with); a segment (``group@A-B``,
    :func:`tierax.models.prefetch.segmented_scan`) and XLA's host offloader (``policy``): every
    layer."""
    if mechanism == "prefetch" and not plan_lib.is_segment(group):
        return held_per_layer * host_slots(name, layers)
    return held_per_layer * layers


def spare_loads(group: str, name: str, mechanism: str) -> int:
    """Layers of ``name`` the backward loads beyond the L it uses: under ``prefetch`` its last
    iteration re-reads layer 0 (no branch in the loop), and a value stored in its own layer (and a
    segment's) loads its last layer before the loop too — a later-stored value's last layer is
    already on device; XLA's host offloader (``policy``) loads each layer once."""
    if mechanism != "prefetch":
        return 0
    return 1 if plan_lib.is_segment(group) or stored_in_own_layer(name) else 0


def forward_collective_s(g, links: dict) -> float:
    """Seconds one layer of group ``g`` spends in its forward's collectives, each axis at its own
    link."""
    by_axis = dict(g.forward_collective_bytes_by_axis)
    rest = g.forward_collective_bytes_per_layer - sum(
        by_axis.values()
    )  # bytes with no axis (an API inventory)
    return (
        sum(b / links[a].bytes_per_s for a, b in by_axis.items())
        + max(0.0, rest) / links["tensor"].bytes_per_s
    )


@dataclass(frozen=True)
class ItemTerms:
    """What one (group, activation) costs under each placement, per device per step."""

    group: str
    name: str
    bytes: int  # all layers
    bytes_per_layer: int
    recompute_s: float  # if remat
    d2h_s: float  # if offloaded, per step (all layers)
    h2d_s: float
    recompute_hbm_s: float = 0.0  # the part of recompute_s that is non-matmul work at HBM bandwidth
    # the part of recompute_s that a fused attention kernel takes
    recompute_attention_s: float = 0.0
    host_bytes: int = 0  # if offloaded (:func:`offload_host_bytes`)
    # the compute its own stores can hide under (all layers; :func:`store_window_s`), inf: only
    # its group's window bounds it
    d2h_window_s: float = math.inf


@dataclass(frozen=True)
class GroupTerms:
    name: str
    num_layers: int
    base_bytes: int  # carry of every layer (kept under any plan)
    save_all_extra_bytes: (
        int  # extra when the group runs with no remat (every activation on device)
    )
    base_recompute_s: float  # unnamed recomputation under any remat policy
    fwd_s: float  # all layers
    bwd_s: float  # all layers, without recomputation
    d2h_window_s: float  # compute a group's stores can hide under (all layers)
    h2d_window_s: float
    base_recompute_hbm_s: float = (
        0.0  # the part of base_recompute_s that is non-matmul work at HBM bandwidth
    )
    # the parts of base_recompute_s that a fused attention kernel takes and that the repeated
    # forward collectives take
    base_recompute_attention_s: float = 0.0
    base_recompute_collective_s: float = 0.0


def layer_forward_s(g, rates: Rates) -> float:
    """One layer's forward seconds of group inventory ``g``: its matmuls (a fused attention
    kernel's at its rate, fp8 GEMMs at theirs), its non-matmul HBM bytes and its gathers and
    scatters."""
    f8, dims = g.fp8_flops_share, g.matmul_min_dim_shares
    matmuls = matmul_s(
        g.forward_flops_per_layer,
        g.fused_attention_flops_per_layer,
        rates,
        fp8_share=f8,
        min_dim_shares=dims,
    )
    return matmuls + _forward_nonmatmul_s(g, rates)


def _forward_nonmatmul_s(g, rates: Rates) -> float:
    return g.forward_hbm_bytes_per_layer / rates.hbm_bytes_per_s + indexed_s(
        g.forward_indexed_per_layer, rates
    )


def store_window_s(a, g, rates: Rates, mechanism: str) -> float:
    """Compute seconds (all layers) that the stores of offloaded ``a`` (of group inventory ``g``)
    can hide under, where XLA bounds them by the layer's structure (TPU targets,
    :attr:`Rates.store_windows_by_name`, under tierax's prefetching scan on a whole group).

    XLA:TPU updates a layer's value in place in the scan's carry, so a store issued in the layer
    that makes the value (:func:`tierax.models.prefetch.stored_in_own_layer`) ends with that
    iteration — it hides under the layer's forward after the value is made — and a store issued a
    layer later starts with the next iteration and ends before that iteration makes the value
    again — it hides under the forward before it (XLA's own schedule in a deviceless compile:
    bench/results/tpu_copy_schedule.json; the stores' waits on the chip:
    bench/results/chip/profiles).  The forward's non-matmul seconds are split in the matmul
    FLOPs' proportion.  inf where nothing but the group's forward bounds them."""
    if mechanism != "prefetch" or plan_lib.is_segment(g.name) or not rates.store_windows_by_name:
        return math.inf
    f8, dims, F = g.fp8_flops_share, g.matmul_min_dim_shares, g.forward_flops_per_layer
    hbm_s = _forward_nonmatmul_s(g, rates)
    layer = layer_forward_s(g, rates)

    def upto(flops: float, fused: float) -> float:  # forward seconds up to that point
        return matmul_s(flops, fused, rates, fp8_share=f8, min_dim_shares=dims) + hbm_s * (
            flops / F if F else 0.0
        )

    if stored_in_own_layer(a.name):  # from the value's making to the layer's end
        per_layer = layer - upto(a.flops_made_per_layer, a.fused_flops_made_per_layer)
    else:  # from the next layer's start to where it writes the value again
        per_layer = upto(a.flops_before_per_layer, a.fused_flops_before_per_layer)
    return max(0.0, per_layer) * g.num_layers


def exposed_stores(items, g) -> float:
    """Store seconds of offloaded ``items`` (:class:`ItemTerms` of group ``g``) that no compute
    hides: beyond the group's forward, or beyond each item's own window, whichever is more."""
    over_group = sum(i.d2h_s for i in items) - g.d2h_window_s
    over_own = sum(max(0.0, i.d2h_s - i.d2h_window_s) for i in items)
    return max(0.0, over_group, over_own)


def host_held_bytes(a, layers: int, mechanism: str, host_layout=None) -> int:
    """Host bytes of offloaded activation ``a`` (an inventory :class:`~tierax.tracing.inventory.
    Activation` of a group of ``layers`` layers): :func:`offload_host_bytes`, or where
    ``host_layout`` (a :attr:`tierax.tracing.program.Program.host_layout` entry: (stack slots, own
    buffers)) says how the compiled program holds the group's offloaded values, that many slots of
    its stack and that many host buffers of its own, each of the layer's largest value of the
    name."""
    if host_layout is None:
        return offload_host_bytes(a.group, a.name, a.host_held_bytes_per_layer, layers, mechanism)
    slots, own = host_layout
    return slots * a.host_held_bytes_per_layer + own * a.host_value_held_bytes


def item_terms(
    inv: Inventory,
    rates: Rates,
    mechanism: str = plan_lib.DEFAULT_MECHANISM,
    host_layout: Mapping[str, tuple[int, int]] | None = None,
) -> list[ItemTerms]:
    """Per offloadable activation: bytes, recompute seconds, store and load seconds.

    Under ``prefetch`` the forward stores every layer's slice once (a value stored a layer later
    stores zeros first, its last layer staying on device) and the backward loads L plus
    :func:`spare_loads`; ``host_layout``: group → how its compiled program holds its offloaded
    values on the host (:func:`host_held_bytes`; a group not in it: :func:`offload_host_bytes`).
    """
    layout = dict(host_layout or {})
    out = []
    for g in inv.groups:
        for a in g.activations:
            if a.name == N.DECODER_LAYER_INPUT:
                continue  # the scan carry: always on device (counted in GroupTerms.base_bytes)
            out.append(
                ItemTerms(
                    g.name,
                    a.name,
                    a.held_total_bytes,  # 0 for a value the backward never needs (its docs)
                    a.held_bytes_per_layer,
                    (
                        matmul_s(
                            a.recompute_flops_per_layer,
                            a.recompute_fused_flops_per_layer,
                            rates,
                            fp8_share=g.fp8_flops_share,
                            min_dim_shares=g.matmul_min_dim_shares,
                        )
                        + a.recompute_hbm_bytes_per_layer / rates.hbm_bytes_per_s
                    )
                    * g.num_layers,
                    a.host_held_bytes_per_layer * g.num_layers / rates.d2h_bytes_per_s,
                    (
                        a.host_held_bytes_per_layer * g.num_layers
                        + spare_loads(g.name, a.name, mechanism) * a.host_held_bytes_per_layer
                    )
                    / rates.h2d_bytes_per_s,
                    a.recompute_hbm_bytes_per_layer * g.num_layers / rates.hbm_bytes_per_s,
                    fused_attention_s(a.recompute_fused_flops_per_layer, rates) * g.num_layers,
                    host_held_bytes(a, g.num_layers, mechanism, layout.get(g.name)),
                    store_window_s(a, g, rates, mechanism),
                )
            )
    return out


def group_terms(
    inv: Inventory, rates: Rates, schedule: str, mechanism: str = plan_lib.DEFAULT_MECHANISM
) -> list[GroupTerms]:
    w = staging_and_window(schedule, mechanism)[1]
    links = network.axis_links(inv.mesh, rates)
    out = []
    for g in inv.groups:
        L = g.num_layers
        named = sum(
            a.held_bytes_per_layer for a in g.activations if a.name != N.DECODER_LAYER_INPUT
        )
        hb = rates.hbm_bytes_per_s
        F, Fa = g.forward_flops_per_layer, g.fused_attention_flops_per_layer
        f8, dims = g.fp8_flops_share, g.matmul_min_dim_shares
        fwd = layer_forward_s(g, rates) * L
        bwd = (
            matmul_s(F, Fa, rates, backward=True, fp8_share=f8, min_dim_shares=dims)
            + g.backward_hbm_bytes_per_layer / hb
            + indexed_s(g.backward_indexed_per_layer, rates)
        ) * L
        base = (
            matmul_s(
                g.base_recompute_flops_per_layer,
                g.base_recompute_fused_flops_per_layer,
                rates,
                fp8_share=f8,
                min_dim_shares=dims,
            )
            + g.base_recompute_hbm_bytes_per_layer / hb
        ) * L
        # A rematerialised layer repeats its forward: its matmuls, its HBM-bound work and its
        # collectives (the MoE dispatch/combine all-to-alls, the tensor-parallel all-reduces).
        repeat_collective = forward_collective_s(g, links) * L
        repeat = base + repeat_collective
        out.append(
            GroupTerms(
                g.name,
                L,
                g.carry_bytes_per_layer * L,
                (g.save_all_bytes_per_layer - g.carry_bytes_per_layer - named) * L,
                repeat,
                fwd,
                bwd,
                w * fwd,
                w * (bwd + base),
                g.base_recompute_hbm_bytes_per_layer * L / hb,
                fused_attention_s(g.base_recompute_fused_flops_per_layer, rates) * L,
                repeat_collective,
            )
        )
    return out
