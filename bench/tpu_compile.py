#!/usr/bin/env python3
"""Deviceless TPU compile of a Llama shape on v5p under the planner's plan: XLA's peak vs capacity.

Needs libtpu (the tpu-aot extra, which ``make venv`` installs; ``pip install 'tierax[tpu-aot]'``).
For each case, runs ``tierax plan --out`` (planner cases), then ``tierax compile --target v5p
--json`` on the plan, each in its own process, and writes one record: command, machine, versions
(jax, jaxlib, libtpu), the planner's prediction (``plan`` or ``simulate``) and XLA's figures per
case.  Cases: the planner's plan at microbatch 4 and 2, and remat-full at microbatch 4 (nothing
offloaded) as a reference.

    python bench/tpu_compile.py [--out bench/results/tpu_compile.json]

Recorded here (2 shared CPU cores, ~12 min) with
``PYTHONPATH=src /tmp/scratch/tpuvenv/bin/python bench/tpu_compile.py`` (Python 3.11, jax/jaxlib
0.10.2, libtpu 0.0.42.1).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import subprocess
import sys
import tempfile
import time

from tierax import records, xla_flags
from tierax.fileio import write_text_atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA = "tierax.tpu-compile/1"
MODEL = ["--model", "llama3-8b"]
SHAPE = ["--target", "v5p", "--devices", "8", "--mesh", "fsdp=8", "--seq", "8192"]
CASES = [("planner", 4), ("remat-full", 4), ("planner", 2)]  # (plan, microbatch per device)
GIB = 2**30


def _tierax(*args: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "tierax.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"tierax {' '.join(args)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout), wall


def _versions() -> dict:
    out = {}
    for dist in ("jax", "jaxlib", "libtpu", "flax", "optax"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/tpu_compile.json"))
    args = ap.parse_args()
    versions = _versions()
    if versions["libtpu"] is None:
        sys.exit("libtpu is not installed: pip install 'tierax[tpu-aot]'")
    xla_flags.configure(
        platforms="cpu"
    )  # the record's machine info starts JAX: never as a TPU backend
    cases, summary = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for plan, mb in CASES:
            shape = [*SHAPE, "--microbatch", str(mb)]
            case: dict = {"plan": plan, "microbatch": mb}
            if plan == "planner":
                plan = str(pathlib.Path(tmp) / f"planner-{mb}.yaml")
                prediction, case["plan_wall_s"] = _tierax("plan", *MODEL, *shape, "--out", plan)
                case |= {"plan_yaml": pathlib.Path(plan).read_text(), "planner_result": prediction}
            else:  # the cost model's prediction for a fixed plan
                simulated, _ = _tierax("simulate", *MODEL, *shape, "--plan", plan)
                case["planner_result"] = {
                    "predicted": simulated[0] if isinstance(simulated, list) else simulated
                }
            compiled, case["wall_s"] = _tierax("compile", *MODEL, *shape, "--plan", plan)
            case["compile"] = compiled
            cases.append(case)
            key = f"{case['plan']} mb{mb}"
            summary[key] = {
                "xla_peak_gib": round(compiled["device_peak_bytes"] / GIB, 2),
                "xla_temp_gib": round(compiled["device_temp_bytes"] / GIB, 2),
                "capacity_gib": round(compiled["device_capacity_bytes"] / GIB, 2),
                "fits": compiled["fits"],
                "host_temp_gib": round(compiled["host_temp_bytes"] / GIB, 2),
                "compile_time_s": round(compiled["compile_time_s"], 1),
            }
            if "planner_result" in case:
                pred = case["planner_result"]["predicted"]
                summary[key]["predicted"] = {
                    "peak_device_gib": round(pred["peak_device_bytes"] / GIB, 2),
                    "host_gib": round(pred["host_bytes"] / GIB, 2),
                    "fits": pred["fits"],
                    "step_time_s": pred["step_time_s"],
                    "tflops_per_device": pred["tflops_per_device"],
                }
            print(
                f"{key:15s} XLA peak {summary[key]['xla_peak_gib']:6.1f} GiB of "
                f"{summary[key]['capacity_gib']:.1f} GiB (fits: {compiled['fits']}), host "
                f"{summary[key]['host_temp_gib']:.2f} GiB, compile "
                f"{compiled['compile_time_s']:.1f} s"
                + (
                    f"; predicted peak {summary[key]['predicted']['peak_device_gib']} GiB"
                    if "predicted" in summary[key]
                    else ""
                ),
                flush=True,
            )
    doc = records.envelope(SCHEMA, " ".join([pathlib.Path(sys.executable).name, *sys.argv])) | {
        "versions": versions,
        "configuration": " ".join([*MODEL, *SHAPE]),
        "summary": summary,
        "cases": cases,
    }
    write_text_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
