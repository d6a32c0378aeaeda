"""``tierax calibrate --runs RUNS.yaml --out RATES.yaml``: the cost model's resource factors fitted
to measured runs (:mod:`tierax.calibration`), each run's leave-one-out error printed beside the
uncalibrated model's; a fit that cannot be checked or does not beat the uncalibrated model is
refused (exit 2) and nothing is written."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tierax import launch
from tierax.cli.common import console
from tierax.errors import TieraxError


def _tierax_identity() -> dict:
    """tierax's version and, in a git checkout, its commit (None elsewhere)."""
    import importlib.metadata
    import pathlib

    try:
        version = importlib.metadata.version("tierax")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=pathlib.Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit or None}


def cmd_calibrate_runs(args) -> int:
    from tierax import calibration
    from tierax.costmodel.resources import check_resources
    from tierax.fileio import check_output_file, write_text_atomic
    from tierax.records import command_line
    from tierax.report.tables import calibration_fit_table

    if args.runs is None or args.out is None:
        raise TieraxError(
            "--runs and --out go together: tierax calibrate --runs RUNS.yaml --out RATES.yaml "
            "(without them calibrate measures this machine)"
        )
    factors = None
    if args.factors is not None:
        factors = [f.strip() for f in args.factors.split(",") if f.strip()]
        if not factors:
            raise TieraxError(
                "--factors is empty; give some of gemm, attention, memory, collectives"
            )
        check_resources(factors, "--factors")
    by = args.by or "target"
    out = check_output_file(args.out, "--out")
    runs = calibration.load_runs(args.runs)  # every run checked, every log read, before tracing
    for r in runs:
        if r.time_source != "step_seconds":
            print(f"{r.name}: measured {r.measured_s:.4g} s, {r.time_source}", file=sys.stderr)
    launch.start()
    prepared = []
    for r in runs:
        if not args.json:
            print(f"tracing {r.name} ({r.target})", file=sys.stderr)
        prepared.append(calibration.prepare(r))
    fits = calibration.calibrate(prepared, by=by, factors=factors)
    refused = calibration.problems(fits)
    if args.json:
        print(json.dumps({"groups": {g.key: _json(g) for g in fits}, "refused": refused}, indent=2))
    else:
        console().print(calibration_fit_table(fits, by))
    if refused:
        raise TieraxError("fit refused, nothing written: " + "; ".join(refused))
    result = calibration.calibrated_rates(
        fits,
        by=by,
        auto=factors is None,
        tierax=_tierax_identity(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command=command_line(
            ["calibrate", "--runs", args.runs, "--out", args.out]
            + (["--factors", args.factors] if args.factors else [])
            + (["--by", args.by] if args.by else [])
        ),
        schedule=",".join(sorted({r.schedule for r in runs})),
    )
    write_text_atomic(out, result.to_yaml())
    if not args.json:
        print(f"wrote {out}: use it with --rates {out} (simulate, plan, compile)")
    return 0


def _json(g) -> dict:
    fs = g.factor_set()
    return {
        "factors": dict(g.factors),
        "clamped": list(g.clamped),
        "tried": [{"factors": list(n), "loo_median": m} for n, m in g.tried],
        "runs": {
            n: {
                "measured_s": e.measured_s,
                "uncalibrated_s": e.uncalibrated_s,
                "loo_s": e.loo_s,
                "fitted_s": e.fitted_s,
            }
            for n, e in fs.runs.items()
        },
        "median_abs_error": {w: fs.median_abs_error(w) for w in ("uncalibrated", "loo", "fitted")},
    }
