"""The one place where XLA flags and backend options are set.

Everything here must happen before the JAX backend starts (the first JAX
operation).  ``configure`` refuses to run later instead of silently doing nothing.
"""

from __future__ import annotations

import os

from tierax.errors import TieraxError

# Named presets of XLA GPU flags (they are registered, and ignored, on CPU).
PRESETS: dict[str, tuple[str, ...]] = {
    "none": (),
    "lhs": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
    "lhs-pipelined": (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_pipelined_host_offloading=true",
    ),
}


def _backends_started() -> bool:
    from jax._src import xla_bridge  # no public query exists

    return xla_bridge.backends_are_initialized()


def configure(*, cpu_devices: int | None = None, preset: str = "none") -> list[str]:
    """Set the host CPU device count and an XLA flag preset; returns the flags added.

    Raises:
      TieraxError: unknown preset, or the backend has already started.
    """
    if preset not in PRESETS:
        raise TieraxError(f"unknown XLA preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    if cpu_devices is None and not PRESETS[preset]:
        return []
    import jax

    if _backends_started():
        raise TieraxError(
            "XLA options must be set before JAX starts its backend; call tierax.xla_flags.configure "
            "before any JAX operation"
        )
    if cpu_devices is not None:
        if cpu_devices < 1:
            raise TieraxError(f"--devices must be ≥ 1, got {cpu_devices}")
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    flags = list(PRESETS[preset])
    if flags:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    return flags
