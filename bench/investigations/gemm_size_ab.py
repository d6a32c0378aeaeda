#!/usr/bin/env python3
"""What the CPU GEMM rate by smallest dimension changes in one time-fidelity run, machine apart.

Question: what does the CPU GEMM rate by smallest dimension change in one time-fidelity run,
apart from the machine?  Answered by the A/B table on the time-model page (the same record's cases
predicted with and without the term).
Records: bench/results/gemm_size_ab.json
Docs: docs/results/time-model.md

Every case of a ``bench/time_fidelity.py`` record predicted again from that record's own
calibrations (the frozen one and each shape's interleaved one), with the rates by smallest
dimension and without them (every GEMM at the GEMM mix's rate, the model before the term), against
the same measured medians.  Nothing is timed here; only the inventory is traced again (the model's
code as it is now, the plans as the record ran them).

    PYTHONPATH=src python bench/investigations/gemm_size_ab.py [RECORD] \
        [--out bench/results/gemm_size_ab.json]
        [--docs bench/results/gemm_size_ab.json]

The two predictions differ in one term only, so their errors' difference is the term's effect,
not a change of machine state between runs.  The record names the time-fidelity record it read.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and the benchmarks these read

import _common  # noqa: E402

ROOT = BENCH.parent
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

SCHEMA = "tierax.gemm-size-ab/1"
DOCS_MARKER = "gemm-size-ab"
CURVES = ("matmul_size_rates_float32", "matmul_size_rates_bfloat16")


def _without_curves(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in CURVES}


def _errors(cases: list[dict], key: str) -> dict:
    errs = [abs(c[key]) for c in cases]
    return {
        "within_15_percent": sum(e <= 0.15 for e in errs),
        "median_abs_error": statistics.median(errs),
        "max_abs_error": max(errs),
    }


def shape_cases(shape: dict) -> list[dict]:
    """Each case of one shape of the record, predicted four ways (calibration × term)."""
    import time_fidelity as tf

    from tierax import costmodel as cm
    from tierax import plan as plan_lib
    from tierax.tracing.model_program import for_inventory

    cfg = tf.config(shape["shape"])
    inv = tf._inventory(cfg, shape["shape"])
    planned = plan_lib.Plan.from_dict(shape["planner"]["placements"], source="the record")
    plans = {n: plan_lib.preset(n, cfg) for n in tf.PLANS if n != "planner"} | {"planner": planned}
    calibrations = {"frozen": shape["_frozen"], "interleaved": shape["interleaved_calibration"]}
    out = []
    for case in shape["cases"]:
        measured = case["measured"]["median"]
        row = {"plan": case["plan"], "measured_s": measured}
        for cal_name, entry in calibrations.items():
            for term, cal in (("by_size", entry), ("mix_only", _without_curves(entry))):
                rates = cm.target_rates("cpu", cfg.dtype, calibration={"cpu": cal})
                p = cm.simulate(
                    plans[case["plan"]], for_inventory(cfg, inv), rates, tf.SCHEDULE
                ).step_time_s
                row[f"{cal_name}_{term}_s"] = p
                row[f"{cal_name}_{term}_error"] = p / measured - 1
        # the record's own prediction: the check that this reproduces it
        row["record_frozen_s"] = case["predicted_step_s"]
        out.append(row)
    return out


def markdown(doc: dict) -> str:
    lines = [
        "| shape | plan | measured s | frozen: by size | frozen: mix only | "
        "interleaved: by size | interleaved: mix only |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in doc["shapes"]:
        for c in s["cases"]:
            lines.append(
                f"| {s['name']} | {c['plan']} | {c['measured_s']:.3f} | "
                f"{c['frozen_by_size_error']:+.1%} | {c['frozen_mix_only_error']:+.1%} | "
                f"{c['interleaved_by_size_error']:+.1%} | {c['interleaved_mix_only_error']:+.1%} |"
            )
    sm = doc["summary"]
    parts = []
    for cal in ("frozen", "interleaved"):
        for term, label in (("by_size", "by size"), ("mix_only", "mix only")):
            e = sm[f"{cal}_{term}"]
            parts.append(
                f"{cal} {label}: {e['within_15_percent']} of {sm['cases']} within 15 %, "
                f"median |error| {e['median_abs_error']:.1%}"
            )
    lines += ["", "; ".join(parts) + f" (`{doc['command']}`, from `{doc['source_record']}`)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "record",
        nargs="?",
        default="bench/results/time_fidelity.json",
        help="a bench/time_fidelity.py record (default bench/results/time_fidelity.json)",
    )
    _common.add_out(ap, "gemm_size_ab.json")
    _common.add_docs(ap, SCHEMA)
    args = ap.parse_args(argv)
    if args.docs:
        path = _common.write_docs_table(DOCS_MARKER, markdown(args.docs))
        print(f"wrote {path}")
        return 0
    try:
        record = _common.docs_record("tierax.time-fidelity/1")(args.record)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not all(k in record["calibration"] for k in CURVES):
        ap.error(
            f"{args.record}: the record's calibration has no rates by smallest dimension (made "
            "before them); give a record made by bench/time_fidelity.py since"
        )
    doc = _common.envelope(SCHEMA, argv)
    doc |= {"source_record": args.record, "source_created": record["created"], "shapes": []}
    for shape in record["shapes"]:
        name = shape["shape"]["name"]
        print(f"{name} ...", file=sys.stderr, flush=True)
        cases = shape_cases(shape | {"_frozen": record["calibration"]})
        doc["shapes"].append({"name": name, "cases": cases})
    cases = [c for s in doc["shapes"] for c in s["cases"]]
    doc["summary"] = {"cases": len(cases)} | {
        f"{cal}_{term}": _errors(cases, f"{cal}_{term}_error")
        for cal in ("frozen", "interleaved")
        for term in ("by_size", "mix_only")
    }
    doc["summary"]["max_drift_from_record_s"] = max(
        abs(c["frozen_by_size_s"] - c["record_frozen_s"]) for c in cases
    )
    print(markdown(doc))
    print(f"wrote {_common.write_record(args.out, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
