"""The first-touch term (CPU only).

XLA:CPU allocates a step's temporary buffer anew on every call.  glibc's malloc serves an
allocation above its mmap threshold (dynamic, at most 32 MiB on 64-bit Linux) with fresh pages
from the operating system, which faults each page in on its first write, and returns them at
``free``: every byte of such a step's temporary memory costs a page fault per step.  A step's
minor page faults × the page size equal XLA:CPU's compiled temp bytes (bench/time_fidelity.py
records both); below the threshold malloc may recycle its heap and the faults come and go, so
smaller temporaries are not counted.  The temp bytes are the peak less the arguments the step
donates and reuses: parameters and optimizer state.  A GPU's allocator keeps its pool, so a GPU
target's rate is 0: no term.
"""

from __future__ import annotations

from tierax.costmodel.rates import Rates
from tierax.tracing.inventory import Inventory

MMAP_THRESHOLD_MAX_BYTES = 32 * 2**20


def fresh_bytes(peak_bytes: float, inv: Inventory) -> float:
    """A step's temporary bytes: the peak less the donated parameters and optimizer state."""
    return max(0.0, peak_bytes - inv.param_bytes - inv.optimizer_bytes)


def first_touch_s(peak_bytes: float, inv: Inventory, rates: Rates) -> float:
    """Seconds a step spends on the first write of its fresh memory (0 without a rate, or when
    the temporaries fit under malloc's mmap threshold)."""
    fresh = fresh_bytes(peak_bytes, inv)
    if not rates.first_touch_bytes_per_s or fresh <= MMAP_THRESHOLD_MAX_BYTES:
        return 0.0
    return fresh / rates.first_touch_bytes_per_s
