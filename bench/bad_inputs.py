#!/usr/bin/env python3
"""Run the bad inputs and faults of issue 14 against the CLI; record exit code and first stderr line
of each.

    .venv/bin/python bench/bad_inputs.py [--out FILE]  # → bench/results/bad_inputs.json, a table

Each case runs in a fresh temporary directory (nothing outside it is written). Ctrl-C, disk-full and
damaged-checkpoint cases are exercised by tests/test_outputs.py (they need a running training).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "bench" / "results" / "demo-bench-tiny-deepseek.json")


def cases(tmp: pathlib.Path) -> list[tuple[str, list[str], str | None]]:
    (tmp / "keep").mkdir()
    (tmp / "keep" / "mine.txt").write_text("the user's file")
    (tmp / "afile").write_text("x")
    (tmp / "plan.yaml").write_bytes(b"plan: \xff\xfe\n")
    (tmp / "bare.json").write_text(json.dumps({"schema": "tierax.bench/1"}))
    nan = json.loads(pathlib.Path(DEMO).read_text())
    nan["records"][0]["step_time_s"] = float("nan")
    (tmp / "nan.json").write_text(json.dumps(nan))
    (tmp / "run.yaml").write_text(
        "model: tiny-llama\nplan: minimal\nmicrobatch: 2\nseq: 16\nsteps: 3\n"
        "optimizer: {warmup_steps: 1}\n"
    )
    return [
        ("profile --out DIR that holds files", ["profile", "--out", str(tmp / "keep")], None),
        ("bench --out /proc/x/b.json", ["bench", "--out", "/proc/x/b.json"], None),
        (
            "train with checkpoint.dir = a file",
            [
                "train",
                str(tmp / "run.yaml"),
                f"log.dir={tmp / 'r'}",
                f"checkpoint.dir={tmp / 'afile'}",
            ],
            None,
        ),
        ("train log.dir=/proc/x", ["train", str(tmp / "run.yaml"), "log.dir=/proc/x"], None),
        ("compile --microbatch 0", ["compile", "--microbatch", "0"], None),
        ("bench --microbatch 0", ["bench", "--microbatch", "0"], None),
        ("bench --devices 0", ["bench", "--devices", "0"], None),
        ("inventory --target a100", ["inventory", "--target", "a100"], None),
        ("non-UTF-8 plan file", ["simulate", "--plan", str(tmp / "plan.yaml")], None),
        ("compile --microbatch -1", ["compile", "--microbatch", "-1"], None),
        (
            "verify --set vocab_size=1000000000000",
            ["verify", "--set", "vocab_size=1000000000000"],
            None,
        ),
        ("plan --budget-gib nan", ["plan", "--budget-gib", "nan"], None),
        ("plan --out /proc/x", ["plan", "--out", "/proc/x/p.yaml"], None),
        ("report --out <existing file>", ["report", DEMO, "--out", str(tmp / "afile")], None),
        (
            'report of {"schema": "tierax.bench/1"}',
            ["report", str(tmp / "bare.json"), "--out", str(tmp / "rep")],
            None,
        ),
        (
            "report of a record with a NaN step time",
            ["report", str(tmp / "nan.json"), "--out", str(tmp / "rep")],
            None,
        ),
        (
            "inventory --json | head -c 10",
            ["inventory", "--model", "tiny-deepseek", "--json"],
            "pipe",
        ),
    ]


def run(args: list[str], mode: str | None) -> tuple[int, str, float]:
    cmd = _common.tierax(*args)
    if mode == "pipe":
        t0 = time.perf_counter()
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        p.stdout.read(10)
        p.stdout.close()
        err = p.stderr.read().decode()
        rc = p.wait()
        wall = time.perf_counter() - t0
    else:
        r = _common.run(cmd, timeout=600)
        rc, err, wall = r.returncode, r.stderr, r.wall_s
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return rc, (lines[-1] if lines else "(nothing on stderr)"), wall


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "bad_inputs.json")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for what, cli_args, mode in cases(tmp):  # not `args`: the parsed options name --out
            rc, line, wall = run(cli_args, mode)
            rows.append(
                {
                    "case": what,
                    "exit": rc,
                    "stderr": line.replace(str(tmp), "TMP"),
                    "seconds": round(wall, 1),
                }
            )
            print(f"| {what} | {rc} | {rows[-1]['stderr']} |", flush=True)
        kept = (tmp / "keep" / "mine.txt").read_text() == "the user's file"
    doc = _common.envelope("tierax.bad_inputs/1", argv) | {
        "profile_out_untouched": kept,
        "cases": rows,
    }
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
