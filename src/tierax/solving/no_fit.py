"""Why no plan fits, and what would: the message of :class:`tierax.solving.planner.NoPlanFits`.

The planner's floor is every activation recomputed with every part of the training state it may
place offloaded.  When that floor fits the device budget and still no plan was found, the host
budget binds (the offloaded state needs more host memory than it allows); otherwise the device
budget does.  The remedies are the caller's (CLI options or the Python API's arguments), less a
larger device budget where the budget already is the target's maximum, plus what the floor itself
points at: a loss tiled in more pieces where the logits make the peak, and the training state
placed by the planner where it was kept on device.
"""

from __future__ import annotations

import dataclasses
import re

from tierax import costmodel as cm
from tierax.plan import Placement, StatePlacement
from tierax.sizes import size_text

# The largest loss tiling a hint suggests (the tiles must divide the sequence).
MAX_HINT_TILES = 64


def _tiles_hint(prog, b: cm.Breakdown, budget: int, evaluate, cli: bool) -> str:
    """``--set loss_tiles=N``: the fewest tiles (dividing seq, up to :data:`MAX_HINT_TILES`) whose
    floor, re-evaluated with the loss in N tiles, fits the budget."""
    head, inv = prog.head, prog.inventory
    if head is None or b.peak_phase != "loss" or not b.logits_bytes:
        return ""
    tiles = head.tiles
    n = tiles * 2
    while n <= MAX_HINT_TILES:
        if inv.seq % n == 0:
            tiled_inv = dataclasses.replace(inv, logits_bytes=inv.logits_bytes * tiles // n)
            floor = evaluate(
                dataclasses.replace(
                    prog.with_inventory(tiled_inv), head=dataclasses.replace(head, tiles=n)
                )
            )
            if floor.peak_device_bytes <= budget:
                how = f"--set loss_tiles={n}" if cli else f"loss_tiles={n} in the model config"
                return (
                    f"; the loss holds {size_text(b.logits_bytes)} of logits and their gradients: "
                    f"{how} computes it in {n} tiles, and the floor then fits "
                    f"({size_text(floor.peak_device_bytes)})"
                )
        n *= 2
    return ""


def message(
    prog,
    rates,
    schedule: str,
    mechanism: str,
    budget: int,
    host_budget: int,
    *,
    place_state: bool,
    grad_accum: int,
    remedies: str,
) -> str:
    """The no-fit message for the program ``prog`` under the device and host budgets (see the
    module)."""
    from tierax.costmodel import state as state_cm

    inv = prog.inventory
    remat = {(i.group, i.name): Placement.REMAT for i in cm.item_terms(inv, rates)}
    kinds = [k for k in state_cm.PLANNED_KINDS if k != "grad_accum" or grad_accum > 1]
    all_state = (
        {
            part.group: StatePlacement(**{k: Placement.OFFLOAD for k in kinds})
            for part in state_cm.planned_terms(prog, rates, grad_accum)[0]
        }
        if place_state and rates.offload_is_real
        else {}
    )

    def evaluate(program, state=all_state):
        return cm.evaluate(remat, program, rates, schedule, mechanism, state, grad_accum)

    floor = evaluate(prog)
    b = floor.breakdown
    # A user's trace is at the shapes its caller traced, not at a microbatch × seq.
    at = f" at microbatch {inv.microbatch} × seq {inv.seq}" if prog.batch_shaped else ""
    cli = "--" in remedies
    at_max = budget >= rates.usable_device_bytes
    if at_max:  # a larger device budget is no way out: it is the target's usable maximum
        remedies = re.sub(r",? (or )?a larger (--budget-gib|budget=)", "", remedies)
    if all_state and floor.peak_device_bytes <= budget:
        on_device = evaluate(prog, {})
        option = "--host-budget-gib" if cli else "host_budget="
        return (
            f"no plan fits {prog.name}{at} in a host budget of {size_text(host_budget)} per device "
            f"(device budget {size_text(budget)}): the host budget binds. Recomputing everything "
            f"needs {size_text(on_device.peak_device_bytes)} {cm.phase_text(on_device.breakdown)} "
            f"with the training state on device, and offloading enough of it to fit needs up to "
            f"{size_text(floor.host_bytes)} of host memory (the offloaded state, held twice during "
            f"the streamed update). Give a larger {option} ({rates.target} has "
            f"{size_text(rates.host_memory_bytes)} per device), or: "
            + remedies[0].lower()
            + remedies[1:]
        )
    terms = ", ".join(
        f"{label.replace('activations on device', 'layer inputs')} {size_text(n)}"
        for label, n in cm.peak_rows(b)
        if n
    )
    hints = _tiles_hint(prog, b, budget, evaluate, cli)
    if not place_state and rates.offload_is_real and cli:
        hints += (
            "; without --state-on-device the planner may also offload the training state "
            "(AdamW moments, master weights) to host memory"
        )
    if at_max:
        hints += f"; the device budget is already {rates.target}'s usable maximum"
    return (
        f"no plan fits {prog.name}{at} in a device budget of {size_text(budget)}: recomputing "
        f"everything still needs {size_text(floor.peak_device_bytes)} {cm.phase_text(b)} ({terms})"
        f"{hints}. {remedies}"
    )
