"""The transposing-fusion term (CPU only).

XLA:CPU computes a float32 weight-gradient operand made by elementwise operations in a fusion
that writes it transposed.  When that fusion broadcasts a scalar or slices a scan's stacked
residual at the loop index, it runs as a slow loop reading its inputs one row apart
(:func:`tierax.tracing.hbm.transposed_reads` counts those reads per layer; microbenchmarks: an
order of magnitude slower than the same fusion of plain arrays, which costs about a copy and is not
counted).  Per group:

* the fusions that broadcast are slow under every plan;
* the others are slow where they read a residual from the scan's stacks: without remat every
  residual is stacked; under a remat policy only the kept named activations (and the scan
  carry) are, the rest recomputed in the backward; a residual's reads are its share of its
  fusion's;
* a group of one layer has no stacks (XLA drops a one-trip loop).

Seconds = reads / ``Rates.transpose_read_elems_per_s``, and reads of rows a multiple of 4 KiB
apart (:func:`tierax.tracing.hbm.row_aliased`) / ``Rates.transpose_aliased_read_elems_per_s`` (both
measured by ``tierax calibrate``); without the rate (GPU and TPU targets: they transpose in
tiles) the term is 0.
"""

from __future__ import annotations

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel.rates import Rates
from tierax.tracing.inventory import GroupInventory, Inventory


def group_terms(g: GroupInventory, rates: Rates) -> tuple[float, float, dict[str, float]]:
    """(seconds under a remat policy keeping no named activation, seconds without remat,
    {name: seconds more when kept under a remat policy}), all layers of ``g``."""
    rate = rates.transpose_read_elems_per_s
    if not rate:
        return 0.0, 0.0, {}
    aliased_rate = rates.transpose_aliased_read_elems_per_s or rate

    def seconds(spread: float, aliased: float) -> float:
        """Seconds of one layer's reads in each row-stride class."""
        return spread / rate + aliased / aliased_rate

    layers = g.num_layers
    stacks = 1.0 if layers > 1 else 0.0
    named = {
        a.name: seconds(a.transposed_elems_per_layer, a.transposed_aliased_elems_per_layer)
        * layers
        * stacks
        for a in g.activations
        if a.transposed_elems_per_layer or a.transposed_aliased_elems_per_layer
    }
    carry = named.pop(N.DECODER_LAYER_INPUT, 0.0)  # always kept
    carry += (
        seconds(g.transposed_carry_elems_per_layer, g.transposed_carry_aliased_elems_per_layer)
        * layers
        * stacks
    )
    always = seconds(
        g.transposed_always_elems_per_layer, g.transposed_always_aliased_elems_per_layer
    )
    residual = seconds(
        g.transposed_residual_elems_per_layer, g.transposed_residual_aliased_elems_per_layer
    )
    base = always * layers + carry
    save_all = base + residual * layers * stacks
    return base, save_all + sum(named.values()), named


def transpose_s(placements: dict, inv: Inventory, rates: Rates) -> float:
    """The term for explicit placements ``{(group, name): Placement}`` (carries may be absent;
    offloaded counts as kept: XLA:CPU keeps it on the device)."""
    total = 0.0
    for g in inv.groups:
        base, save_all, named = group_terms(g, rates)
        mine = {
            a.name: placements.get((g.name, a.name), plan_lib.Placement.DEVICE)
            for a in g.activations
            if a.name != N.DECODER_LAYER_INPUT
        }
        kept = placements.get((g.name, plan_lib.UNNAMED), plan_lib.Placement.REMAT)
        if kept is plan_lib.Placement.DEVICE:  # no remat: every intermediate's reads
            total += save_all
        else:
            total += base + sum(
                s for n, s in named.items() if mine.get(n) is not plan_lib.Placement.REMAT
            )
    return total
