"""``tierax calibrate``: measure the rates the cost model uses, on the machine at hand.

Measured: the matmul rate (float32 and bfloat16) and, on a GPU, the host↔device
copy bandwidth each way (pinned host memory).  Results are stored in
``tierax.costmodel.CALIBRATION_FILE`` under the target key (``cpu`` here; the GPU
kind on a GPU) and used by ``simulate`` and ``plan`` instead of datasheet figures.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp

from tierax import costmodel as cm
from tierax.fileio import write_text_atomic

_KIND_TO_TARGET = {"H100": "h100", "H200": "h200", "B200": "b200", "GB200": "gb200"}


def _best(f, *args, repeats: int = 5) -> float:
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t)
    return best


def matmul_rate(dtype: str, n: int) -> float:
    x = jnp.ones((n, n), jnp.dtype(dtype))
    return 2.0 * n**3 / _best(jax.jit(lambda a: a @ a), x)


def copy_bandwidth(nbytes: int = 1 << 30) -> tuple[float, float]:
    """(device→host, host→device) bytes/s through pinned host memory."""
    dev = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    device = jax.sharding.SingleDeviceSharding(dev, memory_kind="device")
    x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), device)
    d2h = nbytes / _best(lambda a: jax.device_put(a, host), x)
    h = jax.device_put(x, host)
    h2d = nbytes / _best(lambda a: jax.device_put(a, device), h)
    return d2h, h2d


def target_key() -> str:
    dev = jax.devices()[0]
    if dev.platform != "gpu":
        return "cpu"
    for kind, key in _KIND_TO_TARGET.items():
        if kind in dev.device_kind.replace(" ", ""):
            return key
    return dev.device_kind


def run_and_save() -> dict:
    key = target_key()
    gpu = key != "cpu"
    n = 8192 if gpu else 1024
    entry = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "matmul_flops_per_s_float32": matmul_rate("float32", n),
        "matmul_flops_per_s_bfloat16": matmul_rate("bfloat16", n),
    }
    entry["matmul_flops_per_s"] = entry["matmul_flops_per_s_float32"]
    if gpu:
        entry["d2h_bytes_per_s"], entry["h2d_bytes_per_s"] = copy_bandwidth()
    data = cm.load_calibration()
    data[key] = entry
    write_text_atomic(cm.CALIBRATION_FILE, json.dumps(data, indent=2) + "\n")
    return {"target": key, "file": str(cm.CALIBRATION_FILE), **entry}
