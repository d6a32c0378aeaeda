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
The host link and the gathers' and scatters' rates are the measuring chip's own on that generation
only (no per-generation figure to scale them by).  Where Google published a generation's GEMM
rates by size (the data file's ``published_gemm``, copied from
``bench/data/tpu_published_rates.yaml``), that generation's GEMMs take its own published
large-GEMM share (:func:`large_gemm_rate`) in place of the measuring chip's, and the measured
shares by smallest dimension keep their shape under it.

``tierax.costmodel.rates.target_rates`` reads :func:`for_target` when no ``tierax calibrate`` file
measured the target.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

DATA_FILE = "tpu_kernel_rates.json"
FORMAT = "tierax.tpu-kernel-rates-data/2"
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
    # gathers and scatters (tierax.measure.accel_rates.indexed_rates): seconds per index and the
    # bytes per second a scatter writes; 0: none measured on this generation
    index_op_s: float = 0.0
    scatter_bytes_per_s: float = 0.0


def _pct(x: float) -> str:
    return f"{x:.0%}"


# A published GEMM table's large-GEMM rate: its first size whose rate is within this share of the
# largest size's (where the rate stops growing with size).
PLATEAU = 0.01


def large_gemm_rate(by_size) -> tuple[int, float]:
    """The (size, FLOP/s) of a published GEMM table ``by_size`` ((size, FLOP/s), ascending) where
    its rate stops growing: the first point within :data:`PLATEAU` of the largest size's rate."""
    top = by_size[-1][1]
    for size, rate in by_size:
        if rate >= top * (1 - PLATEAU):
            return int(size), float(rate)
    raise AssertionError("unreachable: the last point is within the plateau")


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
    top_dim, top_eff = gemms[-1]
    published = d.get("published_gemm", {}).get(spec.key) if not same else None
    gemm_scale = 1.0
    if published:
        size, rate = large_gemm_rate(published["by_size"])
        gemm_scale = rate / spec.peak("bfloat16") / top_eff
    size_rates = tuple((dim, e * gemm_scale * peak) for dim, e in gemms)
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
        how = d.get("host_link_what", "a round trip through a prefetching layer scan")
        sources["host_link"] = (
            f"{host / 1e9:.2f} GB/s per direction through the step's offload path ({how}) "
            f"measured on {chip}"
        )
    index_s = scatter = 0.0
    if same and d.get("index_op_s"):
        index_s, scatter = d["index_op_s"], d["scatter_bytes_per_s"]
        sources["indexed"] = (
            f"gathers and scatters at {index_s * 1e9:.2f} ns per index, scatters writing at "
            f"{scatter / 1e9:.0f} GB/s beyond it, measured on {chip} "
            f"({d['indexed_measured_by']})"
        )
    share = top_eff * gemm_scale  # the large GEMMs' share of the peak on this target
    if published:
        sources["matmul"] = (
            f"{_pct(share)} of the {peak / 1e12:.0f} TFLOP/s {peak_name} datasheet peak (Google "
            f"Cloud TPU docs): bf16 GEMMs at m = n = k = {size} measured at {rate / 1e12:.1f} "
            f"TFLOP/s per device by Google ({published['source']}), the first size within "
            f"{PLATEAU:.0%} of the largest's rate"
        )
        sources["matmul_by_size"] = (
            "GEMMs by smallest dimension d at the shares measured on "
            f"{chip}, times {gemm_scale:.3f} ({spec.key}'s published large-GEMM share over the "
            f"{d['target']} chip's): "
            + ", ".join(f"{dim} {_pct(e * gemm_scale)}" for dim, e in gemms)
            + f", linear in log d, the nearest point's beyond; no {spec.key} chip measured"
        )
    fp8 = 0.0
    if fp8_peak:
        fp8 = share * fp8_peak
        sources["fp8_matmul"] = (
            f"{_pct(share)} (the bf16 GEMMs' share "
            + (f"published for {spec.key}" if published else f"measured on {d['target']}")
            + f", assumed for fp8: no fp8 GEMM measured) of the {fp8_peak / 1e12:.0f} TFLOP/s "
            "fp8 datasheet peak, the bf16 shares by smallest dimension"
        )
    return TpuKernelRates(
        matmul=share * peak,
        size_rates=size_rates,
        attention_table=table,
        hbm=hbm_eff * spec.hbm_bytes_per_s,
        host_link=host,
        fp8=fp8,
        sources=sources,
        index_op_s=index_s,
        scatter_bytes_per_s=scatter,
    )
