#!/usr/bin/env python3
"""A segmented plan against the best unsegmented one: the planner's prediction and XLA's compile.

For Llama-3-8B on one H200 (2 × 4096 tokens), ``tierax plan`` and ``tierax plan --segments`` each
choose a plan (their predicted step times side by side), then each plan is compiled for the H200
(``tierax compile --json``): XLA's peak against the device, host bytes per group/segment against the
inventory, and the static overlap check.  Why a split can win here: the device budget holds one of
the MLP inputs for most but not all 32 layers, so an unsegmented plan must recompute or offload it
everywhere while a segmented one keeps it where it fits.  Writes bench/results/segment_plan.json.

    .venv/bin/python bench/segment_plan.py [--out FILE]
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import _common

CASE = ["--model", "llama3-8b", "--target", "h200", "--microbatch", "2", "--seq", "4096"]


def _tierax(*args: str) -> tuple[dict, float]:
    proc = _common.run(_common.tierax(*args), timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"tierax {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout), proc.wall_s


def main() -> int:
    ap = _common.parser(__doc__, "segment_plan.json")
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("unsegmented", []), ("segmented", ["--segments"])):
            path = pathlib.Path(tmp) / f"{label}.yaml"
            planned, plan_s = _tierax("plan", *CASE, *extra, "--out", str(path), "--json")
            compiled, compile_s = _tierax("compile", *CASE, "--plan", str(path), "--json")
            out[label] = {
                "plan_command": "tierax plan " + " ".join(CASE + extra),
                "plan_wall_s": round(plan_s, 1),
                "plan": planned["plan"],
                "predicted_step_s": planned["predicted"]["step_time_s"],
                "predicted_peak_bytes": planned["predicted"]["peak_device_bytes"],
                "predicted_host_bytes": planned["predicted"]["host_bytes"],
                "compile_command": "tierax compile " + " ".join(CASE) + " --plan <that plan>",
                "compile_wall_s": round(compile_s, 1),
                "xla_fits": compiled["fits"],
                "xla_peak_bytes": compiled["device_peak_bytes"],
                "xla_host_bytes": compiled["host_temp_bytes"],
                "offloaded": compiled["offloaded"],
                "overlap": compiled["overlap"]["by_direction"],
            }
    seg, uns = out["segmented"], out["unsegmented"]
    summary = {
        "segmented_split": [
            s["layers"] for g in seg["plan"]["groups"].values() for s in g.get("segments", [])
        ],
        "predicted_speedup": uns["predicted_step_s"] / seg["predicted_step_s"],
        "both_fit_in_xla": seg["xla_fits"] and uns["xla_fits"],
        "every_offloaded_name_on_host": all(
            o["on_host"] for r in out.values() for o in r["offloaded"]
        ),
        "peak_prediction_error": {
            k: r["predicted_peak_bytes"] / r["xla_peak_bytes"] - 1 for k, r in out.items()
        },
    }
    for k, v in summary.items():
        print(f"{k}: {v}")
    record = _common.envelope("tierax.segment_plan/1") | {
        "summary": summary,
        "cases": out,
        "note": "deviceless XLA:GPU compiles (no GPU ran); predicted times are the cost model's",
    }
    _common.write_record(args.out, record)
    print(f"wrote {args.out}")
    return 0 if summary["both_fit_in_xla"] and summary["predicted_speedup"] > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
