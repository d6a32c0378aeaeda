#!/usr/bin/env python3
"""The chip check's offload plans priced with XLA:TPU's own schedule of their host copies.

Question: does the schedule XLA:TPU gives a plan's host copies explain the step time the model
misses on the chip (the head-dim-64 planner's plan)?  Answered, for the loads: replayed at the
model's rates, with the splash kernel's calls timed (tierax.xla.splash_calls) and each copy moving
its host buffer's tiles, the backward's loads wait 30.9 ms a step in the head-dim-64 plan (the
chip's profile: 36 ms in its loads' dones) and 33.9 ms in the dense microbatch-8 plan (the model's
miss there: 30 ms), and none in every plan the model predicts within 3 %.  Not for the stores: the
replay exposes the forward's stores of four planner plans that the chip hides (their steps within
3 % of the model's, which hides them too).  `plan --check` on a TPU target corrects the loads only
(tierax.solving.plan_check).
Records: bench/results/replayed_exposure.json
Docs: docs/concepts/mechanisms.md

For each offload plan that ran in the given chip-check records (bench/tpu_check.py), a deviceless
XLA:TPU compile (v5e, the installed libtpu) of the same case, microbatch and placements; its host
copies replayed at the model's v5e rates (tierax.xla.hlo.host_transfers: the replay ``tierax
compile`` reports as exposed, at the same rates); beside the chip's
step time and the model's prediction (``tierax simulate --target v5e``, no calibration) with its
own exposed transfer time.  The model's step with the replay's exposure in place of its own is the
last column.

    python bench/investigations/replayed_exposure.py [--out bench/results/replayed_exposure.json]
"""

from __future__ import annotations

import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and tpu_check's case shapes

import _common  # noqa: E402

RECORDS = (
    "bench/results/chip/tpu_check_lse.json",
    "bench/results/chip/tpu_check_current_moe.json",
)


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "replayed_exposure.json")
    args = ap.parse_args(argv)
    import json

    from tierax import launch

    launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
    import tpu_check
    from rich.progress import track

    from tierax import costmodel as cm
    from tierax.models import apply_overrides, for_platform, get_config
    from tierax.plan.types import Plan
    from tierax.tracing.model_program import program_of
    from tierax.xla import hlo
    from tierax.xla.compile import compile_for_target, host_transfers

    shapes = {c[0]: c for c in tpu_check.CASES + tpu_check.EXTRA_CASES}
    jobs = []
    for rec in RECORDS:
        for case in json.loads((_common.ROOT / rec).read_text())["cases"]:
            for p in case["plans"]:
                if p.get("ran") and p.get("host_bytes_compiled"):
                    jobs.append((rec, case, p))
    doc = _common.envelope("tierax.replayed-exposure/1", argv)
    doc["rows"] = []
    for rec, case, p in track(jobs, description="compiling"):
        _, base, overrides, seq = shapes[case["model"]][:4]
        cfg = for_platform(apply_overrides(get_config(base), overrides), "tpu")
        rates = cm.target_rates("v5e", cfg.dtype, calibration={})
        plan = Plan.from_dict(p["placements"])
        mb = case["microbatch"]
        _, text = compile_for_target(cfg, plan, "v5e", microbatch=mb, seq=seq)
        replay = hlo.overlap_summary(host_transfers(hlo.parse_module(text), rates))
        pred = cm.simulate(plan, program_of(cfg, mb, seq, {"data": 1, "fsdp": 1}), rates, "lhs", 1)
        model_exposed = pred.breakdown.exposed_d2h_s + pred.breakdown.exposed_h2d_s
        with_replay = pred.step_time_s - model_exposed + replay["est_exposed_s"]
        doc["rows"].append(
            {
                "record": rec,
                "case": case["model"],
                "microbatch": mb,
                "plan": p["plan"],
                "measured_step_s": p["step_time_s"],
                "predicted_step_s": pred.step_time_s,
                "model_exposed_s": model_exposed,
                "replay": replay,
                "predicted_with_replay_s": with_replay,
                "error": pred.step_time_s / p["step_time_s"] - 1,
                "error_with_replay": with_replay / p["step_time_s"] - 1,
            }
        )
    for r in doc["rows"]:
        print(
            f"{r['case']:11s} mb {r['microbatch']:2d} {r['plan']:20s} chip "
            f"{r['measured_step_s'] * 1e3:6.1f} ms, model {r['predicted_step_s'] * 1e3:6.1f} "
            f"({r['error']:+.1%}; exposed {r['model_exposed_s'] * 1e3:5.1f}), replayed exposed "
            f"{r['replay']['est_exposed_s'] * 1e3:5.1f} -> {r['error_with_replay']:+.1%}"
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
