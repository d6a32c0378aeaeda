#!/usr/bin/env python3
"""The host link as a step's copies see it beside compute: tierax's prefetching layer scan over
layers that each run a chain of matmuls and store S bytes of a value on the host (loaded back in
the backward), against the same scan keeping the value on the device, for several S and with the
bytes in one value or split over four; the time offloading adds, against S.

Past the sizes the layers' compute hides, each store and load adds its bytes at the link's rate, so
the slope of the added time over the bytes moved is the rate the copies get beside compute (the
round trip of tierax.measure.accel_rates.step_link_rates runs with almost no compute beside it).

Question: on the v5e chip the MLA + MoE deepseek-offload plan (five copies of up to 160 MiB a
layer) waited 128 ms a step on copies the model prices at 76 ms at the round trip's 15.89 GB/s,
though XLA gave its loads a whole layer backward: is the link slower beside compute, or with
several copies in flight?  Answered for one value: beside compute the copies move 13.62 GB/s
per direction (the slope past 64 MiB a layer, which the layers hid), against the round trip's
15.89 — an upper bound, as the layers' work grows with the value; the cost model's v5e host link
is now this rate (bench/tpu_kernel_rates.py), which takes the deepseek-offload plan from -11.7 %
to -1.7 % of the chip's step and leaves the chip check's other plans within a point.  Four
values: not answered (their layers' work grew with the bytes, so the series has no clean slope).
--minor asks whether a value whose last dimension is below the 128-lane tile (a head dim of 64)
moves slower: on the chip (bench/results/chip/link_minor.json) XLA held a [tokens, n, 64] value's
host stack unpadded (the same host bytes as the 128-wide one) and its copies added less time, not
more (a slope of 23.1 GB/s against 13.7): padding is not what slows the head-dim-64 plan's loads
(bench/results/chip/copy_timeline.json).  Open.
Records: bench/results/chip/link_beside_compute.json, bench/results/chip/link_minor.json,
  bench/results/link_beside_compute_repredicted.json
Docs: docs/concepts/mechanisms.md

    python bench/investigations/link_beside_compute.py --out OUT.json          # on the chip
    python bench/investigations/link_beside_compute.py --out OUT.json --tiny   # rehearsal
    python bench/investigations/link_beside_compute.py --out OUT.json --minor 64,128   # padding
    python bench/investigations/link_beside_compute.py --repredict \
        --out bench/results/link_beside_compute_repredicted.json   # the chip check's plans again
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "investigations"))

import _common  # noqa: E402 — the record envelope

SCHEMA = "tierax.link-beside-compute/1"
CHIP = {"layers": 8, "tokens": 8192, "width": 2048, "matmuls": 8, "sizes_mib": (64, 128, 256)}
TINY = {"layers": 4, "tokens": 256, "width": 128, "matmuls": 2, "sizes_mib": (0.25, 0.5)}
SPLITS = (1, 4)
# The chip-check records whose plans --repredict prices again: each case's latest record (the
# program the chip ran is the one tierax builds now: RoPE's TPU form, one-layer groups).
REPREDICT = {
    "bench/results/chip/tpu_check_rope.json": (("dense", 8), ("dense-hd64", 8), ("dense-hd64", 4),
                                               ("dense-8k", 2)),
    "bench/results/chip/tpu_check_final.json": (("moe", 16), ("mla-moe", 16)),
    "bench/results/chip/tpu_check_shapes.json": (("dense-8k", 1), ("dense-8k", 3)),
    "bench/results/tpu_check.json": (("dense", 4), ("dense", 16), ("moe", 4), ("moe", 8),
                                     ("mla-moe", 4), ("mla-moe", 8)),
}  # fmt: skip


def repredict() -> dict:
    """Every plan the chip ran in :data:`REPREDICT`'s cases, priced by tierax's v5e model now
    (its host link beside compute) and with the round trip's host link instead, beside the
    chip's step; plans the model now refuses (an offload in a one-layer group) are left out."""
    import statistics

    import tpu_check

    from tierax import costmodel as cm
    from tierax.errors import TieraxError
    from tierax.models import apply_overrides, get_config
    from tierax.plan.types import Plan
    from tierax.tracing.model_program import program_of

    now = cm.target_rates("v5e", "bfloat16", calibration={})
    rates_doc = json.loads((ROOT / "bench/results/tpu_kernel_rates.json").read_text())
    trip = rates_doc["rates"]["host_link"]["round_trip"]["d2h_bytes_per_s"]
    before = cm.override_rates(now, [f"host_link={trip / 1e9!r}"])
    rows = []
    for path, cases in REPREDICT.items():
        doc = json.loads((ROOT / path).read_text())
        for case in doc["cases"]:
            if (case["model"], case["microbatch"]) not in cases:
                continue
            _, base, overrides, seq, _, _ = next(
                c for c in (*tpu_check.CASES, *tpu_check.EXTRA_CASES) if c[0] == case["model"]
            )
            named = [o.replace("attention=auto", "attention=splash") for o in overrides]
            prog = program_of(apply_overrides(get_config(base), named), case["microbatch"], seq)
            for p in case["plans"]:
                if not p.get("ran"):
                    continue
                plan = Plan.from_dict(p["placements"])
                try:
                    t_now = cm.simulate(plan, prog, now, "lhs", 1).step_time_s
                    t_trip = cm.simulate(plan, prog, before, "lhs", 1).step_time_s
                except TieraxError:
                    continue
                rows.append(
                    {
                        "record": path,
                        "model": case["model"],
                        "microbatch": case["microbatch"],
                        "plan": p["plan"],
                        "measured_s": p["step_time_s"],
                        "predicted_s": t_now,
                        "predicted_round_trip_link_s": t_trip,
                        "error": t_now / p["step_time_s"] - 1,
                        "error_round_trip_link": t_trip / p["step_time_s"] - 1,
                    }
                )
    errs = [abs(r["error"]) for r in rows]
    errs_trip = [abs(r["error_round_trip_link"]) for r in rows]
    return {
        "host_link_bytes_per_s": now.d2h_bytes_per_s,
        "round_trip_bytes_per_s": trip,
        "plans": rows,
        "median_abs_error": statistics.median(errs),
        "worst_abs_error": max(errs),
        "median_abs_error_round_trip_link": statistics.median(errs_trip),
        "worst_abs_error_round_trip_link": max(errs_trip),
    }


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "link_beside_compute.json")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (a rehearsal anywhere)")
    ap.add_argument(
        "--repredict",
        action="store_true",
        help="no measurement: price the chip check's plans again with the model's host link and "
        "with the round trip's (any machine)",
    )
    ap.add_argument(
        "--minor",
        type=lambda v: [int(x) for x in v.split(",")],
        help="instead of the splits: one value a layer shaped [tokens, n, MINOR] for each width "
        "given (e.g. 64,128: a head dim below the 128-lane tile against one at it)",
    )
    args = ap.parse_args(argv)
    if args.repredict:
        doc = _common.envelope(SCHEMA, argv) | repredict()
        for r in doc["plans"]:
            print(
                f"{r['model']:10} mb {r['microbatch']:<3} {r['plan']:20} chip "
                f"{r['measured_s'] * 1e3:7.1f} ms  model {r['error']:+6.1%}  with the round trip's "
                f"link {r['error_round_trip_link']:+6.1%}"
            )
        print(
            f"|error| median {doc['median_abs_error']:.1%}, worst {doc['worst_abs_error']:.1%} "
            f"(round trip's link: {doc['median_abs_error_round_trip_link']:.1%}, "
            f"{doc['worst_abs_error_round_trip_link']:.1%})"
        )
        return _common.finish(args.out, doc)
    import jax

    from tierax.measure import accel_rates

    shape = TINY if args.tiny else CHIP
    doc = _common.envelope(SCHEMA, argv)
    doc["platform"] = jax.devices()[0].platform
    doc["device_kind"] = jax.devices()[0].device_kind
    doc["shape"] = {k: v for k, v in shape.items() if k != "sizes_mib"}
    if args.minor:  # one value a layer, its last dimension this wide: a head dim's padding
        doc["minor"] = {}
        sizes = shape["sizes_mib"][1:]  # past the size the layers hide
        for minor in args.minor:
            rows = []
            for mib in sizes:
                row = accel_rates.beside_compute_row(shape, mib, 1, minor=minor)
                rows.append(row)
                print(
                    f"minor {minor}: {row['layer_bytes'] / 2**20:.0f} MiB a layer, host "
                    f"{(row['host_temp_bytes'] or 0) / 2**20:.0f} MiB: added "
                    f"{row['added_s'] * 1e3:.2f} ms",
                    flush=True,
                )
            rate = accel_rates.slope_rate(rows, shape["layers"])
            doc["minor"][str(minor)] = {"rows": rows, "rate_bytes_per_s": rate}
            print(f"minor {minor}: {rate / 1e9 if rate else float('nan'):.2f} GB/s of the "
                  "value's own bytes", flush=True)  # fmt: skip
        return _common.finish(args.out, doc)
    doc["splits"] = {}
    for values in SPLITS:
        rows = []
        for mib in shape["sizes_mib"]:
            row = accel_rates.beside_compute_row(shape, mib, values)
            rows.append(row)
            print(
                f"{values} value(s), {row['layer_bytes'] / 2**20:.0f} MiB a layer: keep "
                f"{row['keep_s'] * 1e3:.2f} ms, offload {row['offload_s'] * 1e3:.2f} ms",
                flush=True,
            )
        rate = accel_rates.slope_rate(rows[1:], shape["layers"])  # past the smallest, hidden or not
        doc["splits"][str(values)] = {
            "rows": rows,
            "rate_bytes_per_s": rate,
            "rate_all_sizes_bytes_per_s": accel_rates.slope_rate(rows, shape["layers"]),
        }
        print(f"{values} value(s): {rate / 1e9 if rate else float('nan'):.2f} GB/s", flush=True)
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
