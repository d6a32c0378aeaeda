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

from tierax import costmodel as cm
from tierax.fileio import write_text_atomic
from tierax.measure import harness

_KIND_TO_TARGET = {"H100": "h100", "H200": "h200", "B200": "b200", "GB200": "gb200"}


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
        "matmul_flops_per_s_float32": harness.matmul_rate("float32", n)["flops_per_s"],
        "matmul_flops_per_s_bfloat16": harness.matmul_rate("bfloat16", n)["flops_per_s"],
    }
    entry["matmul_flops_per_s"] = entry["matmul_flops_per_s_float32"]
    if gpu:
        link = harness.link_bandwidth()
        entry["d2h_bytes_per_s"], entry["h2d_bytes_per_s"] = link["d2h_bytes_per_s"], link["h2d_bytes_per_s"]
    data = cm.load_calibration()
    data[key] = entry
    write_text_atomic(cm.CALIBRATION_FILE, json.dumps(data, indent=2) + "\n")
    return {"target": key, "file": str(cm.CALIBRATION_FILE), **entry}
