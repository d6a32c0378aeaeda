#!/usr/bin/env python3
"""The TPU kernels the chip check's calibration did not measure, measured on the chip in one run:
the splash attention kernel (causal) at every sequence length and head dim the kernel-rate table
asks for, GEMMs whose smallest dimension is below the MXU's 128 (an expert's GEMMs at small token
counts), and the host link beside splash attention against the same link beside matmuls.

* **Splash** (:func:`tierax.measure.accel_rates.splash_rates`, the calibration's own method: the
  forward's and backward's FLOP/s over the wall clock of back-to-back calls, ~16k tokens a call):
  sequences 2k-32k × head dims 64, 128 and 192; a shape the kernel refuses is recorded with its
  error.  Beside each, the kernels alone from traced calls (the wrapper's XLA ops around them
  excluded): what a step's kernels run at (``bench/investigations/splash_in_step.py``).
* **GEMMs** (:func:`tierax.measure.accel_rates.gemm_rates`, the calibration's by-size series):
  [16384, d, 8192] and [16384, 8192, d] in their three roles for d = 16, 32, 64 and 128 (the last
  the calibration's smallest point, measured again as this run's anchor).
* **The host link beside attention** (:func:`tierax.measure.accel_rates.link_beside_compute`'s
  slope): a prefetching layer scan whose layers run splash attention (head dim 64 and 128) and
  store one value on the host, against the same scan keeping it, and the calibration's matmul
  layers at the same sizes in the same process: whether a step's copies move slower beside the
  attention kernels than beside matmuls.

``bench/tpu_kernel_rates.py --sweep RECORD`` takes the splash and GEMM rows into the kernel-rate
table (the cost model's TPU rates).  Each stage is skipped, and says so, once ``--budget-s`` is
spent.

    python bench/tpu_kernel_sweep.py --out bench/results/chip/tpu_kernel_sweep.json   # the chip
    python bench/tpu_kernel_sweep.py --tiny --out /tmp/sweep.json   # a rehearsal on any machine
"""

from __future__ import annotations

import sys
import time

import _common

SCHEMA = "tierax.tpu-kernel-sweep/1"
PROFILE_CALLS = 3
LINK_CALLS = 2  # splash calls a layer of the link-beside-attention scan runs
# The chip's sizes.  The link beside compute: 8 layers of [16384, width] tokens (8 sequences of
# 2048), each running two splash calls (or the calibration's matmuls) and storing one value of
# each size.
FULL = {
    "seqs": (2048, 4096, 8192, 16384, 32768),
    "head_dims": (64, 128, 192),
    "tokens": 16384,
    "gemm_dims": (16, 32, 64, 128),
    "gemm_m": 16384,
    "gemm_wide": 8192,
    "link": {"seq": 2048, "tokens": 16384, "layers": 8, "sizes_mib": (256, 512)},
}
TINY = {
    "seqs": (256,),
    "head_dims": (64, 128),
    "tokens": 512,
    "gemm_dims": (16,),
    "gemm_m": 256,
    "gemm_wide": 256,
    "link": {"seq": 128, "tokens": 256, "layers": 2, "sizes_mib": (0.25, 0.5)},
}


def _over(t0: float, budget: float) -> bool:
    return budget > 0 and time.perf_counter() - t0 > budget


def splash_stage(seqs, head_dims, tokens: int, interpret: bool, t0: float, budget: float):
    from tierax.measure import accel_rates

    rows, skipped = [], []
    for d in head_dims:
        for seq in seqs:
            if _over(t0, budget):
                skipped.append([seq, d])
                continue
            try:
                (row,) = accel_rates.splash_rates(
                    ((seq, d),),
                    tokens=tokens,
                    interpret=interpret,
                    profile_calls=0 if interpret else PROFILE_CALLS,
                )
            except Exception as e:  # noqa: BLE001 — the kernel's refusal of a shape is its row
                rows.append({"seq": seq, "head_dim": d, "error": f"{type(e).__name__}: {e}"[:400]})
                print(f"splash seq {seq} head dim {d}: refused ({type(e).__name__})", flush=True)
                continue
            rows.append(row | {"causal": True})
            alone = row.get("kernel_fwd_flops_per_s")
            print(
                f"splash seq {seq:5d} head dim {d:3d}: {row['fwd_flops_per_s'] / 1e12:6.1f} / "
                f"{row['bwd_flops_per_s'] / 1e12:6.1f} TFLOP/s fwd / bwd"
                + (
                    f" (kernels alone {alone / 1e12:.1f} / "
                    f"{row['kernel_bwd_flops_per_s'] / 1e12:.1f})"
                    if alone and row.get("kernel_bwd_flops_per_s")
                    else ""
                ),
                flush=True,
            )
    return rows, skipped


def gemm_stage(dims, m: int, wide: int, t0: float, budget: float):
    from tierax.measure import accel_rates

    rows, skipped = [], []
    for d in dims:
        if _over(t0, budget):
            skipped.append(d)
            continue
        r = accel_rates.gemm_rates(((m, d, wide), (m, wide, d)))
        rows.append({"min_dim": d, **r})
        print(f"GEMMs, smallest dim {d:4d}: {r['flops_per_s'] / 1e12:6.1f} TFLOP/s", flush=True)
    return rows, skipped


def link_stage(link: dict, interpret: bool, t0: float, budget: float):
    """Each series' rows and slope rate: splash layers at head dim 64 and 128, the calibration's
    matmul layers (:data:`tierax.measure.accel_rates.BESIDE`'s layers at this run's tokens)."""
    from tierax.measure import accel_rates

    series = {
        "splash_hd64": {"width": 1024, "matmuls": LINK_CALLS, "attention": (link["seq"], 64)},
        "splash_hd128": {"width": 2048, "matmuls": LINK_CALLS, "attention": (link["seq"], 128)},
        "matmul": {"width": accel_rates.BESIDE["width"], "matmuls": accel_rates.BESIDE["matmuls"]},
    }
    out, skipped = {}, []
    for name, s in series.items():
        if _over(t0, budget):
            skipped.append(name)
            continue
        shape = {"layers": link["layers"], "tokens": link["tokens"], **s}
        run = shape | ({"attention": (*s["attention"], interpret)} if "attention" in s else {})
        rows = [accel_rates.beside_compute_row(run, mib) for mib in link["sizes_mib"]]
        rate = accel_rates.slope_rate(rows, link["layers"])
        out[name] = {"shape": shape, "rows": rows, "rate_bytes_per_s": rate}
        print(
            f"link beside {name}: "
            + (f"{rate / 1e9:.2f} GB/s" if rate else "no rate (the copies hid)")
            + "; added "
            + ", ".join(f"{r['added_s'] * 1e3:.1f} ms" for r in rows),
            flush=True,
        )
    return out, skipped


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip/tpu_kernel_sweep.json")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (a rehearsal on any machine)")
    ap.add_argument(
        "--budget-s", type=float, default=0.0, help="skip what is left once this is spent (0: none)"
    )
    ap.add_argument(
        "--stages",
        default="splash,gemm,link",
        help="comma-separated: splash, gemm, link (default: all three)",
    )
    args = ap.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - {"splash", "gemm", "link"})
    if unknown or not stages:
        ap.error(f"--stages: unknown {unknown or 'none given'}; choose from splash, gemm, link")
    from tierax import launch

    launch.start(run_step=True)
    import jax

    doc = _common.envelope(SCHEMA, argv, devices=True)
    dev = jax.devices()[0]
    interpret = dev.platform != "tpu"
    doc["device"] = {"platform": dev.platform, "device_kind": dev.device_kind}
    doc["tiny"] = args.tiny
    print(f"{dev.platform}: {dev.device_kind}" + (" (rehearsal)" if interpret else ""), flush=True)
    t0, skipped = time.perf_counter(), {}
    size = TINY if args.tiny else FULL
    if "splash" in stages:
        doc["splash"], skipped["splash"] = splash_stage(
            size["seqs"], size["head_dims"], size["tokens"], interpret, t0, args.budget_s
        )
    if "gemm" in stages:
        doc["gemm"], skipped["gemm"] = gemm_stage(
            size["gemm_dims"], size["gemm_m"], size["gemm_wide"], t0, args.budget_s
        )
    if "link" in stages:
        doc["link_beside"], skipped["link"] = link_stage(size["link"], interpret, t0, args.budget_s)
    doc["skipped"] = {k: v for k, v in skipped.items() if v}
    doc["wall_s"] = time.perf_counter() - t0
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
