#!/usr/bin/env python3
"""tierax's own step for published runs, compiled deviceless: does it fit where MaxText's ran?

Each chosen row of ``bench/data/published_runs.yaml`` is expressed as ``bench/published_runs.py``
expresses it (model, mesh, MaxText remat keys as a plan, precision, attention) and compiled with
``tierax compile --json`` for the row's target in a child process of this interpreter.  The record
holds, per row, XLA's peak and whether it fits beside the cost model's peak for the same plan
(the compile's own prediction: the cost model the published-runs record uses), the compile's
wall time, and the libtpu or CUDA plugin that compiled it.  A compile XLA refuses (out of memory) is
a result, not an error: MaxText's run of that row ran, so tierax's step holds a buffer that
MaxText's does not.

Default rows: the 8- and 32-chip v6e runs (TR-1, TR-3), the sizes a deviceless compile finishes in
minutes here.  Nothing runs on a TPU or GPU.

    .venv/bin/python bench/published_compile.py      # → bench/results/published_compile.json
    .venv/bin/python bench/published_compile.py --rows TR-1 --out /tmp/tr1.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import _common
import published_runs as pr

DEFAULT_ROWS = ("TR-1", "TR-3")
GIB = 2**30


class RowFailed(Exception):
    pass


def _versions() -> dict:
    return _common.versions("jax", "jaxlib", "libtpu", "jax-cuda13-plugin", "flax")


def row_args(run: dict, spec: dict, plan_file: pathlib.Path) -> tuple[list[str], dict]:
    """The ``tierax compile`` arguments of one row and its plan (written to ``plan_file``)."""
    from tierax import hardware

    cfg = pr._config(spec, spec.get("attention", "auto"))
    kind = "gpu" if hardware.platform(run["hw"]) == "gpu" else "tpu"
    plan = pr._plan(spec["remat"], cfg, kind, run["id"])
    plan_file.write_text(plan.to_yaml())
    sets = [f"attention={cfg.attention}", *spec.get("set", [])]
    model = spec.get("model")
    if model is None:
        raise RowFailed(f"{run['id']}: expressed by model fields, not a named config; not compiled")
    args = ["--model", model]
    for s in sets:
        args += ["--set", s]
    return [
        *args,
        "--target", run["hw"],
        "--devices", str(run["devices"]),
        "--mesh", spec["mesh"],
        "--microbatch", str(run["batch"]),
        "--seq", str(run["seq"]),
        "--plan", str(plan_file),
    ], plan.to_dict()  # fmt: skip


def _cli(verb: str, args: list[str], timeout: float) -> tuple[dict, _common.Run]:
    p = _common.run(_common.tierax(verb, *args, "--json"), timeout=timeout, cwd=_common.ROOT)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise RowFailed(f"tierax {verb} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout), p


def peaks(res: dict, subtracted: bool) -> dict:
    """XLA's peak as ``tierax compile`` reported it, and an upper bound that holds whatever libtpu
    counts in its temp.  ``subtracted``: the compile came from a tierax that subtracted the host
    temp from ``temp_size_in_bytes`` for libtpu before 0.0.52 (the record's
    ``host_temp_subtracted``: its first compiles were made so, and gave negative device temps);
    the reported temp plus the host temp then bounds the device temp from above either way.  For a
    compile made without the subtraction ``upper`` is its peak."""
    limit = res.get("device_limit_bytes") or res.get("device_capacity_bytes")
    peak, temp = res.get("device_peak_bytes"), res.get("device_temp_bytes")
    host = (res.get("host_temp_bytes") or 0) if subtracted else 0
    upper = None if peak is None else peak + host
    return {
        "reported_peak_bytes": peak,
        "reported_temp_negative": temp is not None and temp < 0,
        "upper_peak_bytes": upper,
        "limit_bytes": limit,
        "fits_upper_bound": None if upper is None or not limit else upper <= limit,
    }


def compile_row(run: dict, spec: dict, tmp: pathlib.Path, timeout: float) -> dict:
    args, plan = row_args(run, spec, tmp / f"{run['id']}.yaml")
    res, proc = _cli("compile", args, timeout)
    return derived(run, res, subtracted=False) | {
        "command": "tierax compile " + " ".join(args[:-1] + ["PLAN.yaml"]) + " --json",
        "plan": plan,
        "compile_wall_s": proc.wall_s,
        "compile_peak_rss_gib": None if proc.peak_rss_bytes is None else proc.peak_rss_bytes / GIB,
    }


def derived(run: dict, res: dict, *, subtracted: bool) -> dict:
    """A row's figures from its compile JSON ``res`` (also what ``--rederive`` recomputes)."""
    pk = peaks(res, subtracted)
    peak, upper = pk["reported_peak_bytes"], pk["upper_peak_bytes"]
    predicted = (res.get("predicted") or {}).get("peak_device_bytes")
    return {
        "id": run["id"],
        "published": run,
        "fits": res.get("fits"),
        "xla_peak_gib": None if peak is None else peak / GIB,
        "xla_peak_upper_gib": None if upper is None else upper / GIB,
        "reported_temp_negative": pk["reported_temp_negative"],
        "fits_upper_bound": pk["fits_upper_bound"],
        "limit_gib": (pk["limit_bytes"] or 0) / GIB,
        "capacity_gib": (res.get("device_capacity_bytes") or 0) / GIB,
        "predicted_peak_gib": None if predicted is None else predicted / GIB,
        "model_error": None
        if not (peak and predicted) or pk["reported_temp_negative"]
        else predicted / peak - 1,
        "model_error_vs_upper": None if not (upper and predicted) else predicted / upper - 1,
        "host_temp_gib": (res.get("host_temp_bytes") or 0) / GIB,
        "libtpu_version": res.get("libtpu_version"),
        "compile": res,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help=f"row ids of bench/data/published_runs.yaml (default {','.join(DEFAULT_ROWS)})",
    )
    ap.add_argument("--timeout", type=float, default=5400, help="seconds per child process")
    ap.add_argument(
        "--rederive",
        metavar="RECORD.json",
        help="recompute each row's figures from the compile JSON this record holds (nothing is "
        "compiled; the record's own compiles, commands and versions are kept) and rewrite it",
    )
    _common.add_out(ap, "published_compile.json")
    args = ap.parse_args(argv)
    if args.rederive:
        path = pathlib.Path(args.rederive)
        doc = json.loads(path.read_text())
        for i, row in enumerate(doc["rows"]):
            if "compile" in row:
                keep = {k: row[k] for k in ("command", "plan", "compile_wall_s",
                                            "compile_peak_rss_gib") if k in row}  # fmt: skip
                doc["rows"][i] = (
                    derived(
                        row["published"],
                        row["compile"],
                        subtracted=doc.get("host_temp_subtracted", False),
                    )
                    | keep
                )
        doc["rederived"] = _common.command_line(argv)
        _common.write_record(path, doc)
        print(f"{path}: rows rederived from their compile JSON")
        return 0
    data = pr.load_data(pr.DATA)
    runs = {r["id"]: r for r in data["runs"]}
    wanted = [r for r in args.rows.split(",") if r]
    unknown = [r for r in wanted if r not in runs or r not in pr.EXPRESS]
    if unknown:
        ap.error(
            f"--rows: {', '.join(unknown)} not an expressed run of {pr.DATA.name}; choose from: "
            f"{', '.join(r for r in runs if r in pr.EXPRESS)}"
        )
    out = pathlib.Path(args.out)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tierax-published-compile-") as tmp:
        for rid in wanted:
            print(f"{rid}: compiling ...", file=sys.stderr, flush=True)
            try:
                row = compile_row(runs[rid], pr.EXPRESS[rid], pathlib.Path(tmp), args.timeout)
            except Exception as e:  # a row that fails (or times out) is listed, never dropped
                row = {"id": rid, "published": runs[rid], "error": str(e)[-3000:]}
            rows.append(row)
            print(
                f"{rid}: fits={row.get('fits')} xla={row.get('xla_peak_gib')} "
                f"model={row.get('predicted_peak_gib')}",
                file=sys.stderr,
                flush=True,
            )
    doc = _common.envelope("tierax.published-compile/1", argv) | {
        "versions": _versions(),
        "note": "tierax's step for published MaxText runs, compiled deviceless (no TPU or GPU "
        "ran); fits is XLA's verdict on tierax's step, not on MaxText's",
        "host_temp_subtracted": False,
        "rows": rows,
    }
    _common.write_record(out, doc)
    print(json.dumps([{k: r.get(k) for k in ("id", "fits", "fits_upper_bound", "xla_peak_gib",
                                             "xla_peak_upper_gib", "predicted_peak_gib")}
                      for r in rows],
                     indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
