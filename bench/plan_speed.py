#!/usr/bin/env python3
"""Time `tierax plan` end to end on the headline case (DeepSeek-V3 671B on 128 GB200s).

Runs the CLI as a user does (a fresh process: imports, abstract traces, the integer
program), repeats it, and records wall times with the plan's prediction.
Goal: under 10 s on 2 cores.  Writes bench/results/plan_speed.json.

    .venv/bin/python bench/plan_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

from tierax.fileio import write_text_atomic

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASE = ["plan", "--model", "deepseek-v3-671b", "--target", "gb200", "--devices", "128", "--mesh", "fsdp=16,expert=8",
        "--microbatch", "8", "--seq", "4096"]
CASES = {"microbatch-8": CASE, "max-microbatch": CASE[:-4] + ["--seq", "4096", "--max-microbatch"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_speed.json"))
    args = ap.parse_args()
    import jax

    record = {
        "schema": "tierax.plan_speed/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"host": platform.node(), "cores": os.cpu_count(), "python": platform.python_version()},
        "jax_version": jax.__version__,
        "goal_s": 10.0,
        "cases": {},
    }
    for key, case in CASES.items():
        walls, last = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "tierax.cli", *case, "--json"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=600)
            walls.append(time.perf_counter() - t0)
            last = r
        outcome = {"returncode": last.returncode}
        if last.returncode == 0:
            doc = json.loads(last.stdout)
            outcome.update({"microbatch": doc["microbatch"],
                            "predicted": {k: v for k, v in doc["predicted"].items() if k != "breakdown"},
                            "choices": {f"{e['group']}/{e['name']}": e["choice"] for e in doc["explain"]}})
        else:
            outcome["message"] = last.stderr.strip().splitlines()[-1]
        record["cases"][key] = {"command": "tierax " + " ".join(case), "wall_s": walls,
                                "median_wall_s": statistics.median(walls), "outcome": outcome}
        print(f"{key}: median {statistics.median(walls):.1f} s over {args.repeats} runs (goal 10 s), "
              f"exit {last.returncode}")
    out = write_text_atomic(args.out, json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
