#!/usr/bin/env python3
"""How a plan's device peak grows with the microbatch: the model beside XLA:TPU's own compile.

Question: why did the model put remat-full at microbatch 26 of the chip check's dense case under
the v5e chip's limit, where the chip refused it?  Answered: its per-sequence slope lacked the splash
kernel's float32 log-sum-exp, written 128 lanes wide and held by a layer backward that recomputes
the attention (tierax.models.attention.SPLASH_LSE_LANES, priced since).
Records: bench/results/fit_slope.json
Docs: docs/concepts/mechanisms.md

Deviceless XLA:TPU compiles (v5e, the installed libtpu) of remat-full at several microbatches of
the chip check's dense case and of its head-dim-64 case (bench/tpu_check.py), beside the model's
peak (``tierax simulate --target v5e``, no calibration) for the same step, with and without that
buffer; per case, each one's growth per sequence between the first and last microbatch.

    python bench/investigations/fit_slope.py [--out bench/results/fit_slope.json]
"""

from __future__ import annotations

import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and tpu_check's case shapes

import _common  # noqa: E402

GIB = 2**30
MICROBATCHES = {"dense": (8, 16, 24, 26), "dense-hd64": (4, 8, 12)}


def forget_traces() -> None:
    """Drop the inventory's traces kept within the process (they are keyed on the config, not on
    the attention module's constants this script changes)."""
    from tierax.tracing import inventory

    inventory.model_inventory.cache_clear()
    inventory._TRACES.clear()


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "fit_slope.json")
    args = ap.parse_args(argv)
    from tierax import launch

    launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
    import tpu_check
    from rich.progress import track

    from tierax import costmodel as cm
    from tierax.models import apply_overrides, attention, for_platform, get_config
    from tierax.plan.presets import load_plan
    from tierax.tracing.model_program import program_of
    from tierax.xla.compile import compile_for_target

    lanes = attention.SPLASH_LSE_LANES
    shapes = {c[0]: c for c in tpu_check.CASES + tpu_check.EXTRA_CASES}
    doc = _common.envelope("tierax.fit-slope/1", argv)
    doc["cases"] = []
    jobs = [(name, mb) for name, mbs in MICROBATCHES.items() for mb in mbs]
    for name, mb in track(jobs, description="compiling"):
        _, base, overrides, seq = shapes[name][:4]
        cfg = for_platform(apply_overrides(get_config(base), overrides), "tpu")
        rates = cm.target_rates("v5e", cfg.dtype, calibration={})
        plan = load_plan("remat-full", cfg)
        res, _ = compile_for_target(cfg, plan, "v5e", microbatch=mb, seq=seq)
        pred = cm.simulate(plan, program_of(cfg, mb, seq, {"data": 1, "fsdp": 1}), rates, "lhs", 1)
        # the model as it was before the kernel's log-sum-exp buffer was priced
        attention.SPLASH_LSE_LANES = 0
        forget_traces()
        try:
            without = cm.simulate(
                plan, program_of(cfg, mb, seq, {"data": 1, "fsdp": 1}), rates, "lhs", 1
            )
        finally:
            attention.SPLASH_LSE_LANES = lanes
            forget_traces()
        doc["cases"].append(
            {
                "case": name,
                "microbatch": mb,
                "seq": seq,
                "plan": "remat-full",
                "xla_peak_bytes": res.device_peak_bytes,
                "xla_fits": res.fits,
                "libtpu": res.libtpu_version,
                "model_peak_bytes": pred.peak_device_bytes,
                "model_fits": pred.fits,
                "model_without_lse_peak_bytes": without.peak_device_bytes,
                "model_without_lse_fits": without.fits,
            }
        )
    doc["slopes_gib_per_sequence"] = {}
    for name in MICROBATCHES:
        rows = [c for c in doc["cases"] if c["case"] == name]
        lo, hi = rows[0], rows[-1]
        n = hi["microbatch"] - lo["microbatch"]
        doc["slopes_gib_per_sequence"][name] = {
            k: (hi[f"{k}_peak_bytes"] - lo[f"{k}_peak_bytes"]) / n / GIB
            for k in ("xla", "model", "model_without_lse")
        }
    for c in doc["cases"]:
        print(
            f"{c['case']:11s} mb {c['microbatch']:2d}: XLA {c['xla_peak_bytes'] / GIB:6.3f} GiB "
            f"({'fits' if c['xla_fits'] else 'refused'}), model {c['model_peak_bytes'] / GIB:6.3f}"
            f" ({'fits' if c['model_fits'] else 'does not fit'}), without the log-sum-exp buffer "
            f"{c['model_without_lse_peak_bytes'] / GIB:6.3f}"
        )
    print(doc["slopes_gib_per_sequence"])
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
