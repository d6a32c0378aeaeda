"""A stand-in for XLA's compile in the ``plan --check`` tests: the figures the check reads from a
:class:`tierax.xla.compile` result, with the peak the test chooses (no XLA compile)."""

from __future__ import annotations

import types


def compiled(
    peak: int, *, fits: bool = True, out_of_memory: bool = False, host_temp_bytes: int | None = 0
) -> tuple[types.SimpleNamespace, str]:
    """``compile_for_target``'s return for a compile whose device peak is ``peak`` (``fits``:
    within the device; the check's budget decides the rest), with its empty log."""
    return types.SimpleNamespace(
        device_peak_bytes=peak,
        fits=fits,
        out_of_memory=out_of_memory,
        overlap={},
        xla_recompute={},
        peak_over_reported=False,
        host_temp_bytes=host_temp_bytes,
        host_argument_bytes=0,
        compile_time_s=0.0,
    ), ""
