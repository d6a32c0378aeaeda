#!/usr/bin/env python3
"""The chip check's head-dim-64 plan compiled and run under libtpu options that loosen XLA:TPU's
scheduler memory guard: how much of the layer its host loads get, and how fast it then runs.

Question: does XLA:TPU's scheduler shorten the head-dim-64 plan's prefetches because of memory
pressure, and is that why the plan runs slower than predicted on the v5e chip?  Answered: yes, the
memory guard is what shortens the loads (with the scheduler's memory-pressure tracking off they
span the layer), but it explains only part of the loss: with the loads over the whole layer the
plan still runs slower than remat-full, which the cost model predicts it beats.  Not priced;
nothing in tierax's flags changed (the options raise the compiled peak).
Records: bench/results/chip/scheduler_flags.json
Docs: docs/concepts/mechanisms.md

The planner's plan for the chip check's dense head-dim-64 case at microbatch 8
(``bench/results/chip/plans/planned_hd64_mb8.yaml``: q and the attention output offloaded, the
MLP kept) compiles below the scheduler limit the cost model uses, yet its loads get 4-5 kernels of
a layer backward's ~20 (``chip_schedule.py``) and it ran slower than remat-full on the chip.  Here
the same plan is compiled and run under libtpu options that loosen the scheduler's memory guard:

* ``--deviceless``: each option set in a child process (libtpu reads its options once), the plan
  compiled for a v5e chip without one (``chip_schedule.compile_deviceless``; ``--python`` names
  the interpreter, e.g. a Python 3.11 environment with the chip's libtpu 0.0.42.1, whose compile
  is the chip's copy for copy) and the kernels between each host load's start and done counted;
* ``--chip``: on the chip, ``tierax bench`` of remat-full and the plan under each option set, one
  process per set (remat-full, which offloads nothing, is the same program under every set);
* ``--join DIR``: the record from what those wrote into DIR.

    python bench/investigations/scheduler_flags.py --deviceless --python /path/to/py311 --dir DIR
    python bench/investigations/scheduler_flags.py --chip --dir DIR           # on the chip
    python bench/investigations/scheduler_flags.py --join bench/results/chip/scheduler_flags \
        --out bench/results/chip/scheduler_flags.json
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — the record envelope

SCHEMA = "tierax.scheduler-flags/1"
PLAN = "bench/results/chip/plans/planned_hd64_mb8.yaml"
# The option sets, in order: libtpu's defaults, the scheduler's memory limit at the whole device
# (95 % by default), its memory-pressure tracking off.
FLAG_SETS = (
    "",
    "--xla_tpu_scheduler_percent_shared_memory_limit=100",
    "--xla_tpu_enable_scheduler_memory_pressure_tracking=false",
)
MODEL = (
    "--model tiny-llama --set d_model=2048 --set num_layers=8 --set mlp_dim=8192 "
    "--set num_heads=32 --set num_kv_heads=16 --set head_dim=64 --set vocab_size=32000 "
    "--set dtype=bfloat16 --set attention=auto --microbatch 8 --seq 2048 --steps 4"
).split()
_ONE = """
import json, os, sys
sys.path[:0] = [{src!r}, {bench!r}, {inv!r}]
import chip_schedule as C
r = C.compile_deviceless([("dense-hd64", 8, {plan!r})])[0]
print(json.dumps({{"flags": os.environ.get("LIBTPU_INIT_ARGS", ""), "peak": r["device_peak_bytes"],
                  "temp": r["temp_bytes"], "copies": r["copies"]}}))
"""


def deviceless(python: str, out: pathlib.Path) -> None:
    code = _ONE.format(
        src=str(ROOT / "src"),
        bench=str(ROOT / "bench"),
        inv=str(ROOT / "bench" / "investigations"),
        plan=pathlib.Path(PLAN).name,
    )
    with out.open("w") as f:
        for flags in FLAG_SETS:
            env = dict(os.environ, LIBTPU_INIT_ARGS=flags)
            res = subprocess.run(
                [python, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            f.write(res.stdout.strip().splitlines()[-1] + "\n")
            print(f"compiled under {flags or 'the defaults'}", flush=True)


def chip(dir_: pathlib.Path) -> None:
    for i, flags in enumerate(FLAG_SETS, 1):
        env = dict(os.environ, LIBTPU_INIT_ARGS=flags)
        cmd = [sys.executable, "-m", "tierax", "bench", *MODEL, "--plans", f"remat-full,{PLAN}"]
        subprocess.run([*cmd, "--out", str(dir_ / f"hd64_flags_{i}.json")], env=env, check=True)


def join(dir_: pathlib.Path) -> dict:
    """The record: per option set, the deviceless compile's kernels between each host load's start
    and done (where ``--deviceless`` wrote them), and the chip's step times and compiled peaks."""
    lines = sorted(dir_.glob("deviceless*.jsonl"))  # the chip's libtpu where its name says so
    compiled = [json.loads(ln) for ln in lines[0].read_text().splitlines() if ln.startswith("{")]
    rows = []
    for i, flags in enumerate(FLAG_SETS, 1):
        bench = json.loads((dir_ / f"hd64_flags_{i}.json").read_text())
        recs = {r["plan"]: r for r in bench["records"]}
        c = next(c for c in compiled if c["flags"].endswith(flags))
        plan = recs["planned-hd64-mb8"]
        rows.append(
            {
                "flags": flags,
                "deviceless": {
                    "record": str(lines[0].relative_to(ROOT)),
                    "loads_kernels_between": [
                        x["matmuls_or_kernels_between"]
                        for x in c["copies"]
                        if x["direction"] == "h2d" and x["computation"] != "ENTRY"
                    ],
                    "stores_kernels_between": [
                        x["matmuls_or_kernels_between"]
                        for x in c["copies"]
                        if x["direction"] == "d2h"
                    ],
                },
                "chip": {
                    "record": str((dir_ / f"hd64_flags_{i}.json").relative_to(ROOT)),
                    "jax": bench["jax_version"],
                    "remat_full_s": recs["remat-full"]["step_time_s"],
                    "plan_s": plan["step_time_s"],
                    "plan_over_remat_full": plan["step_time_s"] / recs["remat-full"]["step_time_s"],
                    "plan_peak_device_bytes_compiled": plan["peak_device_bytes_compiled"],
                },
            }
        )
    return {"plan": PLAN, "case": "dense-hd64, microbatch 8", "rows": rows}


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip/scheduler_flags.json")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--deviceless", action="store_true")
    mode.add_argument("--chip", action="store_true")
    mode.add_argument("--join", metavar="DIR", type=pathlib.Path)
    ap.add_argument("--dir", type=pathlib.Path, help="where --deviceless / --chip write")
    ap.add_argument("--python", default=sys.executable, help="--deviceless's interpreter")
    args = ap.parse_args(argv)
    if args.deviceless or args.chip:
        if args.dir is None or not args.dir.is_dir():
            ap.error("--deviceless and --chip write into --dir DIR, an existing directory")
        if args.deviceless:
            deviceless(args.python, args.dir / "deviceless.jsonl")
        else:
            chip(args.dir)
        return 0
    doc = _common.envelope(SCHEMA, argv) | join(args.join.resolve())
    for r in doc["rows"]:
        c, d = r["chip"], r["deviceless"]
        print(
            f"{r['flags'] or 'libtpu defaults':58} loads over {d['loads_kernels_between']} "
            f"kernels; plan {c['plan_s'] * 1e3:.1f} ms, remat-full {c['remat_full_s'] * 1e3:.1f} "
            f"({c['plan_over_remat_full']:.3f}x), peak "
            f"{c['plan_peak_device_bytes_compiled'] / 2**30:.2f} GiB"
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
