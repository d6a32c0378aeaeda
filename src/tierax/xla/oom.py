"""XLA's refusal of a program for device memory, read as a result (``tierax compile``: fits false).

XLA:TPU refuses a program over the HBM it gives one (RESOURCE_EXHAUSTED) and states, in its message,
what the program needs and what it has; XLA:GPU compiles any size.  :func:`out_of_memory` reads
those figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OutOfMemory:
    """XLA refused the program for device memory: its figures, where its message states them."""

    required_bytes: int | None  # what XLA says the program needs (its two-decimal figure)
    available_bytes: int | None  # what it says the device has for one program
    message: str


# libtpu's messages (0.0.42.1; 0.0.52 prefixes the first with "E1000: CompileTimeHbmOom:").  The
# first is its early check (arguments and temporaries against the HBM it gives a program), the
# second its allocation check.
_OOM_MESSAGES = (
    re.compile(
        r"memory required for HLO temporaries \((?P<req>[\d.]+)(?P<ru>[KMGT]?)\) "
        r"exceeds available HBM "
        r"\((?P<avail>[\d.]+)(?P<au>[KMGT]?)\)"
    ),
    re.compile(r"Used (?P<req>[\d.]+)(?P<ru>[KMGT]?) of (?P<avail>[\d.]+)(?P<au>[KMGT]?) hbm"),
)
# libtpu prints binary units ("G" is GiB: tests/test_tpu.py reads a 1.2e11-byte pair of buffers as
# 111.76G).
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def out_of_memory(error: Exception) -> OutOfMemory | None:
    """XLA's out-of-device-memory refusal in ``error`` (None: another error).  Scoped VMEM
    exhaustion is a compiler limit on one fusion, not the program's size, so it is not one."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text or "vmem" in text.lower():
        return None
    first = text.strip().splitlines()[0]
    for pattern in _OOM_MESSAGES:
        m = pattern.search(text)
        if m:
            return OutOfMemory(
                int(float(m["req"]) * _UNIT[m["ru"]]),
                int(float(m["avail"]) * _UNIT[m["au"]]),
                first,
            )
    return OutOfMemory(None, None, first)
