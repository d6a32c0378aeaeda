"""A comparison the state-offload tests share: arrays equal within a few float32 ulps of the
array's largest magnitude (for results whose only difference is the order XLA sums a reduction
in)."""

from __future__ import annotations

import numpy as np


def assert_within_ulps(actual, desired, ulps: int = 4) -> None:
    """Every element of ``actual`` within ``ulps`` float32 ulps of ``desired``'s largest magnitude
    (float32 epsilon × that magnitude per ulp); the shapes and dtypes equal."""
    a, d = np.asarray(actual), np.asarray(desired)
    assert a.shape == d.shape and a.dtype == d.dtype, (a.shape, a.dtype, d.shape, d.dtype)
    scale = float(np.abs(d.astype(np.float64)).max()) if d.size else 0.0
    bound = ulps * float(np.finfo(np.float32).eps) * scale
    worst = float(np.abs(a.astype(np.float64) - d.astype(np.float64)).max()) if d.size else 0.0
    assert worst <= bound, (
        f"max |difference| {worst:.3g} > {ulps} ulps of {scale:.3g} ({bound:.3g})"
    )
