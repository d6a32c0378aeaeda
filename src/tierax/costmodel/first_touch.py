"""The first-touch term (CPU only).

XLA:CPU allocates a step's temporary buffers anew on every call; large allocations come from
the operating system, which hands each page over on its first write, so every byte of a step's
temporary memory costs a page fault per step.  A step's minor page faults × the page size equal
XLA:CPU's compiled temp bytes (bench/time_fidelity.py records both), and the temp bytes are the
peak less the arguments the step donates and reuses: parameters and optimizer state.  A GPU's
allocator keeps its pool, so a GPU target's rate is 0: no term.
"""

from __future__ import annotations

from tierax.costmodel.rates import Rates
from tierax.inventory import Inventory


def fresh_bytes(peak_bytes: float, inv: Inventory) -> float:
    """A step's temporary bytes: the peak less the donated parameters and optimizer state."""
    return max(0.0, peak_bytes - inv.param_bytes - inv.optimizer_bytes)


def first_touch_s(peak_bytes: float, inv: Inventory, rates: Rates) -> float:
    """Seconds a step spends on the first write of its fresh memory (0 without a rate)."""
    if not rates.first_touch_bytes_per_s:
        return 0.0
    return fresh_bytes(peak_bytes, inv) / rates.first_touch_bytes_per_s
