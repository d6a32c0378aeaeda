#!/usr/bin/env python3
"""Time `tierax plan` end to end on the headline case (DeepSeek-V3 671B on 128 GB200s).

Runs the CLI as a user does (a fresh process: imports, abstract traces, the integer
program), repeats it, and records wall times with the plan's prediction.
Goal: under 10 s on 2 cores.  Writes bench/results/plan_speed.json.

With ``--baseline REV`` the same cases also run from ``git archive REV`` (same Python, same
venv, its ``src`` first on PYTHONPATH), interleaved run by run with the working tree so both
see the same machine load; the record then holds both medians and whether the two printed
the same JSON (they must, for a change that only makes planning faster).  ``--rev REV`` times
revision REV instead of the working tree (other uncommitted edits then stay out of the comparison).

    .venv/bin/python bench/plan_speed.py [--repeats 5] [--baseline HEAD~1] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASE = ["plan", "--model", "deepseek-v3-671b", "--target", "gb200", *_common.SEED_SCALE_SHAPE]
CASES = {"microbatch-8": CASE, "max-microbatch": CASE[:-4] + ["--seq", "4096", "--max-microbatch"]}


def _run(case: list[str], src: str | None) -> tuple[float, _common.Run]:
    env = dict(os.environ)
    if src:  # the baseline's sources ahead of the editable install
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    r = _common.run(
        _common.tierax(*case, "--json"), timeout=600, env=env, cwd=tempfile.gettempdir()
    )
    return r.wall_s, r


def _outcome(r: _common.Run) -> dict:
    outcome = {"returncode": r.returncode}
    if r.returncode == 0:
        doc = json.loads(r.stdout)
        outcome.update(
            {
                "microbatch": doc["microbatch"],
                "predicted": {k: v for k, v in doc["predicted"].items() if k != "breakdown"},
                "choices": {f"{e['group']}/{e['name']}": e["choice"] for e in doc["explain"]},
            }
        )
    else:
        outcome["message"] = r.stderr.strip().splitlines()[-1]
    return outcome


def _extract(rev: str, into: pathlib.Path) -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return sha


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also time git revision REV, interleaved with the working tree",
    )
    ap.add_argument(
        "--rev", metavar="REV", help="time git revision REV instead of the working tree"
    )
    _common.add_out(ap, "plan_speed.json")
    args = ap.parse_args()
    record = _common.envelope("tierax.plan_speed/1") | {
        "goal_s": 10.0,
        "cases": {},
    }
    with tempfile.TemporaryDirectory(prefix="tierax-plan-speed-") as tmp:
        base_src = cur_src = None
        if args.baseline:
            (pathlib.Path(tmp) / "base").mkdir()
            sha = _extract(args.baseline, pathlib.Path(tmp) / "base")
            base_src = str(pathlib.Path(tmp) / "base" / "src")
            record["baseline"] = {"rev": args.baseline, "commit": sha}
        if args.rev:
            (pathlib.Path(tmp) / "rev").mkdir()
            record["rev"] = {
                "rev": args.rev,
                "commit": _extract(args.rev, pathlib.Path(tmp) / "rev"),
            }
            cur_src = str(pathlib.Path(tmp) / "rev" / "src")
        for key, case in CASES.items():
            walls, base_walls, last, base_last, same = [], [], None, None, True
            for _ in range(args.repeats):
                if base_src:
                    wall, base_last = _run(case, base_src)
                    base_walls.append(wall)
                wall, last = _run(case, cur_src)
                walls.append(wall)
                if base_src:
                    same = same and (last.returncode, last.stdout) == (
                        base_last.returncode,
                        base_last.stdout,
                    )
            entry = {
                "command": "tierax " + " ".join(case),
                "wall_s": walls,
                "median_wall_s": statistics.median(walls),
                "outcome": _outcome(last),
            }
            line = (
                f"{key}: median {statistics.median(walls):.1f} s over {args.repeats} runs "
                f"(goal 10 s), exit {last.returncode}"
            )
            if base_src:
                entry["baseline"] = {
                    "wall_s": base_walls,
                    "median_wall_s": statistics.median(base_walls),
                    "identical_json": same,
                }
                line += (
                    f"; baseline {args.baseline} median {statistics.median(base_walls):.1f} s, "
                    f"same JSON: {same}"
                )
            record["cases"][key] = entry
            print(line)
    # other work on the cores slows every run
    record["machine"]["load_average_1min_at_start"] = record["machine"].pop("load_average_1min")
    record["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    out = _common.write_record(args.out, record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
