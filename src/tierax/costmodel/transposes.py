"""The transposing-fusion term (CPU only).

XLA:CPU computes a float32 weight-gradient operand made by elementwise operations in a fusion
that writes it transposed, reading each input one row apart (:func:`tierax.hbm.transposed_reads`
counts the elements per layer).  A read costs more from a scan's stacked residuals (sliced at
the loop index) than from a value the backward made: the per-op profiles of
bench/time_fidelity.py show these fusions at several times the cost under save-all that they
have under remat-full, whose inputs are all recomputed in place.  So per group:

* every layer reads its ``local`` elements at the plain rate;
* without remat (every activation on device) it reads every residual from the stacks;
* under a remat policy it reads a named activation kept on device (and the scan carry) from the
  stacks, and recomputes the others, unnamed residuals included, reading them at the plain rate;
* a group of one layer has no stacks (XLA drops a one-trip loop): every read is plain.

Rates are elements per second (``Rates.transpose_read_elems_per_s`` and
``stacked_transpose_read_elems_per_s``, measured by ``tierax calibrate``); without them (GPU
and TPU targets: they transpose in tiles) the term is 0.
"""

from __future__ import annotations

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel.rates import Rates
from tierax.inventory import GroupInventory, Inventory


def _rates(rates: Rates) -> tuple[float, float] | None:
    plain, stacked = rates.transpose_read_elems_per_s, rates.stacked_transpose_read_elems_per_s
    return (plain, stacked) if plain and stacked else None


def group_terms(g: GroupInventory, rates: Rates) -> tuple[float, float, dict[str, float]]:
    """(seconds under a remat policy with every named activation recomputed, seconds without
    remat, {name: extra seconds when kept on device under a remat policy}) for all layers."""
    r = _rates(rates)
    if r is None:
        return 0.0, 0.0, {}
    plain, stacked = r if g.num_layers > 1 else (r[0], r[0])
    named = {a.name: a.transposed_elems_per_layer * g.num_layers for a in g.activations}
    local = g.transposed_local_elems_per_layer * g.num_layers
    residual = g.transposed_residual_elems_per_layer * g.num_layers
    carry = named.pop(N.DECODER_LAYER_INPUT, 0.0)  # always kept: read from the stack
    base = (local + residual + sum(named.values())) / plain + carry / stacked
    save_all = local / plain + (residual + sum(named.values()) + carry) / stacked
    device = {n: e / stacked - e / plain for n, e in named.items() if e}
    return base, save_all, device


def transpose_s(placements: dict, inv: Inventory, rates: Rates) -> float:
    """The term for explicit placements ``{(group, name): Placement}`` (carries may be absent;
    offloaded counts as kept: XLA:CPU keeps it on the device)."""
    total = 0.0
    for g in inv.groups:
        base, save_all, device = group_terms(g, rates)
        mine = {a.name: placements.get((g.name, a.name), plan_lib.Placement.DEVICE)
                for a in g.activations if a.name != N.DECODER_LAYER_INPUT}
        if all(p is not plan_lib.Placement.REMAT for p in mine.values()):
            total += save_all
        else:
            kept = [s for n, s in device.items() if mine[n] is not plan_lib.Placement.REMAT]
            total += base + sum(kept)
    return total
