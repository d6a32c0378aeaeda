"""The device kinds JAX reports → tierax's target keys (what a calibration is stored under, and
which target an attached accelerator is)."""

from __future__ import annotations

import re

# A word of the device kind JAX reports ("NVIDIA H100 80GB HBM3", "NVIDIA GB200") → the target.
# Whole words only: "B200" is inside "GB200" and "H200" inside "GH200" (a Grace Hopper, whose
# GPU is not an H200), so a substring test would store one machine's rates under another's key.
_KIND_TO_TARGET = {"H100": "h100", "H200": "h200", "B200": "b200", "GB200": "gb200"}


# The device kinds JAX reports for Cloud TPUs → the target ("TPU v5 lite" is a v5e chip; v5p shows
# as "TPU v5"; TPU7x as "TPU7x").
_TPU_KIND_TO_TARGET = {
    "TPU V5 LITE": "v5e",
    "TPU V5E": "v5e",
    "TPU V5P": "v5p",
    "TPU V5": "v5p",
    "TPU V6 LITE": "v6e",
    "TPU V6E": "v6e",
    "TPU7X": "v7x",
    "TPU V7X": "v7x",
}


def target_key_for(platform: str, device_kind: str) -> str:
    """The calibration key of a device: ``cpu`` on a CPU; the tierax target whose model is a word
    of ``device_kind`` on a GPU, or whose device kind it is on a TPU; else the device kind itself
    (no target reads it)."""
    if platform == "tpu":
        return _TPU_KIND_TO_TARGET.get(" ".join(device_kind.upper().split()), device_kind)
    if platform != "gpu":
        return "cpu"
    words = re.findall(r"[A-Z0-9]+", device_kind.upper())
    for word in words:
        if word in _KIND_TO_TARGET:
            return _KIND_TO_TARGET[word]
    return device_kind
