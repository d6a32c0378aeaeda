"""The TPU kernel rates measured on a chip, as the cost model's default TPU rates: GEMMs by their
smallest dimension, the splash attention kernel by sequence length and head dim, a layer's
non-matmul work, and the host link through the step's own offload path.

The figures are in ``tpu_kernel_rates.json`` beside this module, which ``bench/tpu_kernel_rates.py``
writes from the chip records it extracts (``bench/results/tpu_kernel_rates.json`` names them, with
the command, chip and jax version that measured each rate); nothing in it is typed by hand or
fitted to a training run.  Each rate is held as an *efficiency*: the measured rate over the
measuring chip's datasheet figure (its dense bf16 peak, its HBM bandwidth).  The measuring
generation takes its own rates back; every other TPU target takes those efficiencies times its own
datasheet figure, an assumption the rates' sources state (no chip of that generation measured).
The host link is the measuring chip's own rate on that generation only (no per-generation figure
to scale it by).

``tierax.costmodel.rates.target_rates`` reads :func:`for_target` when no ``tierax calibrate`` file
measured the target.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

DATA_FILE = "tpu_kernel_rates.json"
FORMAT = "tierax.tpu-kernel-rates-data/1"
RECORD = "bench/results/tpu_kernel_rates.json"  # the record the data file is copied from


@functools.cache
def data() -> dict:
    """The packaged data file's content (:data:`DATA_FILE`)."""
    text = resources.files("tierax.hardware").joinpath(DATA_FILE).read_text(encoding="utf-8")
    doc = json.loads(text)
    if doc.get("format") != FORMAT:
        raise ValueError(f"tierax/hardware/{DATA_FILE}: format {doc.get('format')!r}, not {FORMAT}")
    return doc


@dataclass(frozen=True)
class TpuKernelRates:
    """One TPU target's default kernel rates (FLOP/s, bytes/s) and their sources."""

    matmul: float  # GEMMs at a step's shapes (the largest point of ``size_rates``)
    size_rates: tuple  # ((smallest dimension, FLOP/s), ...) ascending
    attention_table: tuple  # ((seq, head dim, forward FLOP/s, backward FLOP/s), ...)
    hbm: float  # a layer's non-matmul work at the bytes the model counts
    host_link: float  # per direction; 0: none measured on this generation
    fp8: float  # fp8 GEMMs at a step's shapes; 0: the target has no fp8 peak
    sources: dict


def _pct(x: float) -> str:
    return f"{x:.0%}"


def for_target(spec, dtype: str) -> TpuKernelRates:
    """The default kernel rates of the TPU target ``spec`` (a :class:`TpuSpec`) for matmuls of
    ``dtype``: the measured efficiencies times its datasheet figures."""
    d = data()
    peak0, hbm0 = d["peak_flops_per_s"], d["hbm_bytes_per_s"]
    peak, fp8_peak = spec.peak(dtype), spec.peak_flops.get("fp8", 0.0)
    same = spec.key == d["target"]
    chip = f"one {d['chip']} chip ({d['target']}, jax {d['jax']}; {RECORD})"
    scaled = (
        ""
        if same
        else f": {d['target']} efficiency measured on the chip, scaled by {spec.key}'s datasheet; "
        f"no {spec.key} chip measured"
    )
    gemms = tuple((int(dim), r / peak0) for dim, r in d["gemm_by_min_dim"])
    size_rates = tuple((dim, e * peak) for dim, e in gemms)
    top_dim, top_eff = gemms[-1]
    table = tuple(
        (int(s), int(h), f / peak0 * peak, b / peak0 * peak) for s, h, f, b in d["splash_causal"]
    )
    hbm_eff = d["nonmatmul_bytes_per_s"] / hbm0
    peak_name = spec.peak_name(dtype)
    sources = {
        "matmul": f"{_pct(top_eff)} of the {peak / 1e12:.0f} TFLOP/s {peak_name} datasheet peak "
        "(Google Cloud TPU docs): "
        f"bf16 GEMMs at a step's shapes (smallest dimension {top_dim}) measured at "
        f"{d['gemm_by_min_dim'][-1][1] / 1e12:.1f} of {peak0 / 1e12:.0f} TFLOP/s on {chip}"
        + scaled,
        "matmul_by_size": "GEMMs by smallest dimension d at the shares of the datasheet peak "
        "measured on the chip: "
        + ", ".join(f"{dim} {_pct(e)}" for dim, e in gemms)
        + f", linear in log d, the nearest point's beyond ({chip})"
        + scaled,
        "fused_attention": "splash attention (causal) forward / backward at the shares of the "
        "datasheet peak measured on the chip by (seq, head dim): "
        + ", ".join(
            f"({s}, {h}) {_pct(f / peak0)}/{_pct(b / peak0)}" for s, h, f, b in d["splash_causal"]
        )
        + ", linear in log seq and in head dim between them, the nearest beyond "
        f"({chip})" + scaled,
        "hbm": f"{_pct(hbm_eff)} of the {spec.hbm_bytes_per_s / 1e9:.0f} GB/s HBM bandwidth "
        "(Google Cloud TPU docs): a layer's non-matmul work at the bytes the model counts, "
        f"measured at {d['nonmatmul_bytes_per_s'] / 1e9:.0f} GB/s of {hbm0 / 1e9:.0f} on {chip}"
        + scaled,
    }
    host = 0.0
    if same:
        host = d["host_link_bytes_per_s"]
        sources["host_link"] = (
            f"{host / 1e9:.2f} GB/s per direction through the step's offload path (a round trip "
            f"through a prefetching layer scan) measured on {chip}"
        )
    fp8 = 0.0
    if fp8_peak:
        fp8 = top_eff * fp8_peak
        sources["fp8_matmul"] = (
            f"{_pct(top_eff)} (the bf16 GEMMs' share measured on {d['target']}, assumed for fp8: "
            f"no fp8 GEMM measured) of the {fp8_peak / 1e12:.0f} TFLOP/s fp8 datasheet peak, the "
            "bf16 shares by smallest dimension"
        )
    return TpuKernelRates(
        matmul=top_eff * peak,
        size_rates=size_rates,
        attention_table=table,
        hbm=hbm_eff * spec.hbm_bytes_per_s,
        host_link=host,
        fp8=fp8,
        sources=sources,
    )
