"""Published kernel rates of GPU targets, each with its source: GEMMs by dtype and shape, the
sustained-power factor for realistic operands, compute slowed by overlapped communication, and
cuDNN's fused attention by sequence length and head dimension.

Nothing here is fitted to a measured training run: the published production runs
(``bench/published_runs.py``) check these figures, they did not choose them.  The cost model reads
them through :func:`tierax.costmodel.rates.target_rates`; a target absent from a table keeps the
datasheet rule there (and its rates line says so).

- **GEMMs** (:func:`gemm`): the best shape of a torch ``matmul`` sweep per GPU and dtype
  (:data:`MAMF`, random normal operands, mean of 100 iterations after 50 warm-up ones) is the rate
  of large GEMMs; smaller ones run at a share of it by their smallest dimension
  (:data:`SHAPE_SHARES`, XLA's own measured table of bf16 GEMMs of the target's architecture,
  sm_90 for Hopper and sm_100 for Blackwell, the two other dimensions at its largest, 4096),
  linear in log dimension between the points
  (:meth:`tierax.costmodel.rates.Rates.matmul_rate_at`).
- **Sustained power** (:data:`SUSTAINED`): a sweep's GEMMs, separated by cache flushes, do not
  hold a GPU at its power cap; a training step's GEMMs do, with realistic operands, and every GPU
  of a node at once.
- **Interference** (:data:`OVERLAP_SLOWDOWN`): compute that runs beside a collective or a host
  copy runs slower (applied in :func:`tierax.costmodel.predict.evaluate` to the compute that
  hides them).
- **Attention** (:func:`attention_shares`): cuDNN's flash attention forward (causal) and backward
  on an H100 by sequence length and head dimension, as shares of the H100's dense peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TERA = 1e12

MAMF_SOURCE = (
    "stas00/ml-engineering, 'Maximum Achievable Matmul FLOPS comparison table' (torch matmul, "
    "best shape of a sweep, random normal operands)"
)


@dataclass(frozen=True)
class Mamf:
    """The best shape of a published matmul sweep: its rate (TFLOP/s) and shape (M×N×K)."""

    tflops: float
    shape: str


# target → dtype key (``bf16``, ``fp8``) → the sweep's best shape.  H200's bf16 row is H100's (the
# table's note: "H200 is the same"); its fp8 row is its own.
MAMF: dict[str, dict[str, Mamf]] = {
    "h100": {"bf16": Mamf(794.5, "2048x2048x13312"), "fp8": Mamf(1402.6, "1024x9216x14336")},
    "h200": {
        "bf16": Mamf(794.5, "H100 SXM's, 'H200 is the same'"),
        "fp8": Mamf(1453.4, "1280x4096x12032"),
    },
    "b200": {"bf16": Mamf(1745.0, "1792x16128x3072"), "fp8": Mamf(3432.5, "15360x4096x3072")},
    "gb200": {"bf16": Mamf(1822.0, "4096x9728x2048"), "fp8": Mamf(3615.6, "19456x5120x1536")},
}

# XLA's default GPU matmul performance table (OpenXLA, its matmul interpolator's data: bf16 × bf16 →
# bf16, batch 1): FLOP/s of the GEMMs 4096 × 4096 × d (M × N × K), d the smallest dimension, for
# Hopper (``sm_90``) and Blackwell (``sm_100``, the table's B200 entries).  The shares of the
# largest point shape every GEMM of a target of that architecture (fp8 GEMMs too: an assumption;
# the sm_100 fp8 column, not applied, falls off faster below d = 2048).
XLA_SM90_BF16 = (
    (256, 392162828341855),
    (512, 543116754678806),
    (1024, 677439636593059),
    (2048, 738736406437117),
    (4096, 783328793548203),
)
XLA_SM100_BF16 = (
    (256, 514706368985559),
    (512, 805318951108611),
    (1024, 1075624166291009),
    (2048, 1277788708367422),
    (4096, 1416867213789406),
)


def _shares(table: tuple) -> tuple[tuple[int, float], ...]:
    return tuple((d, r / table[-1][1]) for d, r in table)


def _shares_text(shares: tuple) -> str:
    return ", ".join(f"{d} {s:.2f}".replace(" 0.", " .").replace(" 1.00", " 1") for d, s in shares)


# compute capability major → (shares by smallest dimension, the table's entry named)
SHAPE_SHARES: dict[int, tuple[tuple[tuple[int, float], ...], str]] = {
    9: (_shares(XLA_SM90_BF16), "sm_90"),
    10: (_shares(XLA_SM100_BF16), "sm_100"),
}
SHAPE_SOURCE = (
    "by smallest dimension d: shares of the 4096³ rate of XLA's default GPU matmul table "
    "(OpenXLA, {arch} bf16 4096×4096×d: d={shares}), linear in log d, the sweep's best-shape rate "
    "from d=4096 up"
)

# Sustained power with realistic operands, as a share of the sweep's best-shape rate.
# Blackwell (measured on GB200, marin-community/marin's mfu30 logbook, 2026-09): inside a training
# step on a whole rack every bf16 GEMM family (cuBLAS and QuACK, grouped expert GEMMs, attention
# and latent projections) runs at 1.4–1.7 PF/s against the sweep's 1822; the midpoint taken.  That
# figure already holds every GPU of the rack at once, realistic operands and the 1200 W cap (the
# logbook's single-GPU microbenchmark at the training's own shapes, 1.44–1.52 PF/s, is a rate at
# those shapes, which the shape shares would count a second time).
# Hopper (assumed: no Hopper measurement was found): the A100's sustained 8192³ rate with random
# normal operands, 257 TFLOP/s (thonking.ai, H. He), over its sweep's 271.2, the one sustained-vs-
# sweep pair of an air-cooled SXM part; the node's 6 % from GB200's single-GPU microbenchmark.
NODE_FACTOR = 0.94
BLACKWELL_IN_TRAINING = (1.4 + 1.7) / 2 * 1000  # TFLOP/s
BLACKWELL_SUSTAINED = BLACKWELL_IN_TRAINING / 1822.0
HOPPER_SUSTAINED = 257 / 271.2
SUSTAINED: dict[int, tuple[float, str]] = {
    9: (
        HOPPER_SUSTAINED * NODE_FACTOR,
        f"×{HOPPER_SUSTAINED * NODE_FACTOR:.3f} sustained power (assumed for Hopper: A100 "
        "sustained 8192³ with random operands 257 over its sweep's 271.2 TFLOP/s, thonking.ai; "
        "× 0.94 for every GPU of a node at once, measured on GB200: marin mfu30 logbook)",
    ),
    10: (
        BLACKWELL_SUSTAINED,
        f"×{BLACKWELL_SUSTAINED:.3f} sustained power (GB200 GEMMs inside a training step on a "
        "whole rack, every bf16 GEMM family at 1.4–1.7 PF/s, midpoint over the sweep's 1822: "
        "marin mfu30 logbook, 2026-09; assumed for every Blackwell part)",
    ),
}

# Compute overlapped with communication runs 18.9 % slower on average (40 % at most) over A100,
# H100, MI250 and MI210 (arXiv:2507.03114); on GB200 a ragged all-to-all holding 32 of 148 SMs cut
# the GEMMs beside it 22 % (the marin logbook).  Every GPU target; no TPU measurement was found.
OVERLAP_SLOWDOWN = 0.189
OVERLAP_SOURCE = (
    "compute hiding a collective or a host copy runs 18.9 % slower (mean over A100/H100/MI250/"
    "MI210, arXiv:2507.03114; GB200: an all-to-all on 32 of 148 SMs cut GEMMs 22 %, marin mfu30 "
    "logbook)"
)

# cuDNN's flash attention on an H100 SXM5, bf16 (FlashAttention-3 paper, arXiv:2407.08608, its
# benchmark figures' cuDNN bars), TFLOP/s by sequence length (batch × sequence = 16k tokens,
# 2048 = heads × head dim): the forward with a causal mask (FLOPs halved), and the backward without
# one (the paper's only backward figures: a causal backward is assumed to run at that rate).
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_FWD_CAUSAL_TFLOPS = {
    64: (225, 288, 334, 363, 379, 388),
    128: (315, 410, 484, 518, 529, 539),
}
ATTENTION_BWD_TFLOPS = {
    64: (266, 348, 395, 417, 432, 433),
    128: (305, 408, 465, 499, 518, 516),
}
ATTENTION_PEAK_TFLOPS = 989.0  # the H100 SXM's dense bf16 peak the figures are shares of
ATTENTION_SOURCE = (
    "cuDNN flash attention on H100 SXM5 bf16 by sequence length and head dim (FlashAttention-3, "
    "arXiv:2407.08608, benchmark figures' cuDNN bars: causal forward; backward without a mask, the "
    "only one published), as shares of the H100's 989 TFLOP/s applied to this target's peak"
)


def interp(points: tuple[tuple[float, float], ...], x: float, log: bool = True) -> float:
    """Piecewise linear (in log ``x`` with ``log``) through ``points`` ((x, y) ascending), the
    nearest point's value outside them."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            t = math.log(x / x0) / math.log(x1 / x0) if log else (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True)
class GemmRates:
    """A target's sourced GEMM rates (FLOP/s, sustained factor applied) and their sources."""

    matmul: float  # large GEMMs of the compute dtype
    size_rates: tuple  # ((smallest dimension, FLOP/s), ...) ascending
    fp8: float  # fp8 GEMMs (0: no fp8 sweep for this target)
    sustained: float
    sources: dict


def dtype_key(dtype: str) -> str | None:
    """The sweep's dtype row for a compute dtype (None: no sweep, e.g. float32)."""
    return {"bfloat16": "bf16", "float16": "bf16", "bf16": "bf16", "fp8": "fp8"}.get(dtype)


def gemm(target: str, dtype: str, compute_capability: tuple[int, int]) -> GemmRates | None:
    """The published GEMM rates of ``target`` for ``dtype``, or None where no sweep is published
    for it (a projection, a float32 step)."""
    key = dtype_key(dtype)
    rows = MAMF.get(target, {})
    arch = compute_capability[0]
    if key is None or key not in rows or arch not in SUSTAINED or arch not in SHAPE_SHARES:
        return None
    sustained, sustained_src = SUSTAINED[arch]
    shares, table = SHAPE_SHARES[arch]
    best = rows[key]
    matmul = best.tflops * TERA * sustained
    size_rates = tuple((d, matmul * s) for d, s in shares)
    fp8_row = rows.get("fp8")
    fp8 = fp8_row.tflops * TERA * sustained if fp8_row else 0.0
    sources = {
        "matmul": f"{best.tflops} TFLOP/s at {best.shape} ({MAMF_SOURCE}) {sustained_src}",
        "matmul_by_size": SHAPE_SOURCE.format(arch=table, shares=_shares_text(shares)),
    }
    if fp8_row:
        sources["fp8_matmul"] = (
            f"{fp8_row.tflops} TFLOP/s fp8 (float8_e4m3fn) at {fp8_row.shape} ({MAMF_SOURCE}) "
            f"×{sustained:.3f} sustained power, the bf16 shapes' shares by smallest dimension "
            "(assumed for fp8)"
        )
    return GemmRates(matmul, size_rates, fp8, sustained, sources)


def attention_shares(seq: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) rate of cuDNN's flash attention at ``seq`` and ``head_dim`` as shares of
    the H100's dense peak: linear in log sequence between the published lengths and linear in head
    dimension between 64 and 128 (the nearest published point outside them)."""

    def at(table: dict) -> float:
        by_dim = {
            d: interp(tuple(zip(ATTENTION_SEQS, v, strict=True)), seq) for d, v in table.items()
        }
        return interp(tuple(sorted(by_dim.items())), head_dim, log=False) / ATTENTION_PEAK_TFLOPS

    return at(ATTENTION_FWD_CAUSAL_TFLOPS), at(ATTENTION_BWD_TFLOPS)


# The shape the fused attention rates of a target's Rates stand at until a program's own sequence
# and head dimension replace them (tierax.costmodel.rates.for_program).
ATTENTION_REFERENCE = (4096, 128)
