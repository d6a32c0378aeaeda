#!/usr/bin/env python3
"""``tierax plan --check`` on recorded cases: each iteration's prediction against XLA's compile.

Cases: DeepSeek-V3 671B at the scale configuration (128 GB200, fsdp=16 × expert=8, 8 × 4096 per
device, loss in 16 tiles); a 5-layer DeepSeek-V3 on 8 GB200s (expert=8) at a 114 GiB budget, where
the first plan does not fit in XLA and the loop repairs it; and any given with ``--case "ARGS"``.
Each runs ``tierax plan ... --check --json`` in a child process; the record keeps each iteration
(budget, workspace correction, predicted and XLA peak, fits, exposed transfer time both ways,
compile seconds) and whether the loop converged.  Writes bench/results/plan_check.json.

    .venv/bin/python bench/plan_check.py [--quick] [--out FILE] \
        [--case "--model llama3-8b --target h200 ..."] [--only-given]
"""

from __future__ import annotations

import json
import shlex
import sys

import _common

CASES = {
    "deepseek-v3-671b gb200×128 fsdp=16,expert=8 mb8×4096": [
        "--model",
        "deepseek-v3-671b",
        "--set",
        "loss_tiles=16",
        "--target",
        "gb200",
        *_common.SEED_SCALE_SHAPE,
    ],
}
# Budget-bound at 114 GiB: the first plan compiles to more than the budget (the record's iterations
# say by how much).
CASES["deepseek-v3 5-layer gb200×8 expert=8 mb8×4096 budget 114 GiB"] = [
    *_common.DEEPSEEK_V3_5_LAYERS,
    "--set",
    "loss_tiles=16",
    "--target",
    "gb200",
    "--mesh",
    "expert=8",
    "--microbatch",
    "8",
    "--seq",
    "4096",
    "--budget-gib",
    "114",
]
QUICK = {
    "tiny-llama h200 mb8×64": [
        "--model",
        "tiny-llama",
        "--target",
        "h200",
        "--microbatch",
        "8",
        "--seq",
        "64",
    ]
}


def main() -> int:
    ap = _common.parser(__doc__, "plan_check.json")
    _common.add_quick(ap)
    ap.add_argument(
        "--case",
        action="append",
        default=[],
        help="extra `tierax plan` arguments (quoted), repeatable",
    )
    ap.add_argument(
        "--only-given",
        action="store_true",
        help="run only the --case cases (e.g. a TPU target)",
    )
    args = ap.parse_args()
    if args.only_given and not args.case:
        sys.exit("--only-given runs the --case cases: give at least one --case")
    cases = {} if args.only_given else dict(QUICK if args.quick else CASES)
    cases.update({c: shlex.split(c) for c in args.case})
    out, ok = {}, True
    for label, cargs in cases.items():
        cmd = _common.tierax("plan", *cargs, "--check", "--json")
        print(f"{label}: tierax plan {' '.join(cargs)} --check", flush=True)
        proc = _common.run(cmd, timeout=3600)
        wall = proc.wall_s
        # with --json, tierax writes the JSON alone to stdout and its progress lines to stderr
        lines = [x for x in proc.stderr.splitlines() if x.startswith("check ")]
        print("\n".join(lines), flush=True)
        start = proc.stdout.find("{")
        if proc.returncode not in (0, 1) or start < 0:
            out[label] = {
                "command": "tierax plan " + " ".join(cargs) + " --check",
                "returncode": proc.returncode,
                "error": proc.stderr.strip().splitlines()[-3:],
                "wall_s": wall,
            }
            ok = False
            continue
        result = json.loads(proc.stdout)
        out[label] = {
            "command": "tierax plan " + " ".join(cargs) + " --check",
            "returncode": proc.returncode,
            "wall_s": round(wall, 1),
            "progress": lines,
            **result,
        }
        ok = ok and result["converged"]
    record = _common.envelope("tierax.plan_check/1") | {
        "cases": out,
        "note": "deviceless XLA compiles (no device ran); the correction is to the workspace term "
        "only",
    }
    _common.write_record(args.out, record)
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
