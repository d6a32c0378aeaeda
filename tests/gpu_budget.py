"""Device budgets for tests on GPU targets, stated as the model's own bytes on top of XLA:GPU's
fixed bytes (its cuBLAS workspace, which depends on the installed jaxlib:
tierax.costmodel.rates.xla_gpu_fixed_bytes), so that a fixture leaves the model the same room under
every jaxlib release."""

from __future__ import annotations

import math

from tierax import costmodel as cm
from tierax.hardware.targets import RUNTIME_RESERVE_FRACTION


def fixed_bytes(target: str = "h200") -> int:
    """XLA:GPU's fixed device bytes on ``target`` under the installed jaxlib, as the model has
    them."""
    return cm.target_rates(target, "float32").fixed_device_bytes


def hbm_size(own: int, target: str = "h200") -> str:
    """``--rate hbm_size=GB`` whose usable memory (the device's less the runtime reserve) is the
    fixed bytes plus ``own`` bytes for the model's own buffers."""
    device = math.ceil((fixed_bytes(target) + own) / (1 - RUNTIME_RESERVE_FRACTION))
    return f"hbm_size={device / 1e9}"
