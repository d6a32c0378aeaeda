#!/usr/bin/env python3
"""MaxText's estimator vs ``tierax plan --max-microbatch --check``: largest batch fitting XLA:TPU.

Same model, slice and sequence on both sides: Llama 3 8B on v5p-8 (4 chips, fsdp=4, MaxText's
default mesh there), sequence 8192 and 4096, every compile deviceless on this CPU machine.  Both
sides compile with MaxText's venv (Python 3.12, ``maxtext[tpu]==0.2.5``: jax, jaxlib and libtpu as
MaxText pins them), so the same XLA:TPU judges both; tierax runs from this checkout
(``PYTHONPATH=src``) under that venv's Python.

* ``--side maxtext``: ``python -m maxtext.utils.estimator`` (greedy remat → offload → device per
  tensor, each policy's batch found by a binary search of compile-and-OOM), parsed from its log:
  every compile (batch, policy, fits or not), the rows it printed, the wall time, and the error it
  stopped on, if any.  Where it printed no rows, each policy's best batch is read from the compiles
  that fitted (``rows_from_log``).
* ``--side tierax``: ``tierax plan --max-microbatch --check`` (the model's largest microbatch,
  confirmed and corrected by compiles), then ``tierax compile`` of ``remat-full`` at every batch
  MaxText's full-remat compiles fitted (does tierax's step fit where MaxText's does?).
* Each choice's tokens/s per chip under tierax's model (``tierax simulate`` of the MaxText policy,
  read as MaxText overrides, and of tierax's plan): batch × sequence ÷ predicted step time.
* ``--docs``: the documentation's estimator-peer table, generated from the record (no compiles).

Each side merges into the one record (``bench/results/estimator_peer.json``), which keeps each
side's command, versions and machine.  Runs for tens of minutes per case on 2 shared cores
(MaxText's search: ~35 compiles).

    python bench/estimator_peer.py --venv /tmp/mt312 [--side maxtext|tierax|all] [--seqs 8192,4096]
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import _common  # noqa: E402

from tierax import records  # noqa: E402

SCHEMA = "tierax.estimator-peer/1"
MODEL, TOPOLOGY, DEVICES = "llama3-8b", "v5p-8", 4
TIERAX_SHAPE = [
    "--model",
    MODEL,
    "--target",
    "v5p",
    "--devices",
    str(DEVICES),
    "--mesh",
    f"fsdp={DEVICES}",
]
ENV = {
    "DECOUPLE_GCLOUD": "TRUE",
    "JAX_PLATFORMS": "cpu",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    # the estimator prints its progress: unbuffered, a run stopped early still leaves its compiles
    "PYTHONUNBUFFERED": "1",
}
GIB = 2**30
# What this script's own jax sets on import (TPU_LIBRARY_PATH to *its* libtpu, TPU_SKIP_MDS_QUERY,
# TF_CPP_MIN_LOG_LEVEL) must not reach the venv's processes: with TPU_LIBRARY_PATH inherited,
# MaxText's jax loaded this venv's older libtpu and its first compile failed on the Pallas kernels'
# serialization.
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")


def child_env(extra: dict | None = None) -> dict:
    return {k: v for k, v in os.environ.items() if k in _KEEP} | ENV | (extra or {})


def versions(py: str) -> dict:
    code = (
        "import importlib.metadata as m, json, sys; "
        "dists = ('maxtext', 'jax', 'jaxlib', 'libtpu', 'flax', 'optax'); "
        "print(json.dumps({d: m.version(d) for d in dists} | {'python': sys.version.split()[0]}))"
    )
    p = subprocess.run(
        [py, "-c", code], capture_output=True, text=True, timeout=300, env=child_env()
    )
    return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-500:]}


def base_yml(py: str) -> str:
    p = subprocess.run(
        [py, "-c", "import maxtext, pathlib; print(pathlib.Path(maxtext.__file__).parent)"],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    if p.returncode:
        sys.exit(f"MaxText is not importable with {py}: {p.stderr[-2000:]}")
    return str(pathlib.Path(p.stdout.strip()) / "configs" / "base.yml")


# --------------------------------------------------------------------------- MaxText's estimator

_CHECK = re.compile(r"Checking whether batch_size=([\d.]+) and policy=(\{.*\}) is OOM")
_IS_OOM = re.compile(r"Is OOM: (True|False)")
_FOUND = re.compile(r"Found valid combo: pdb=([\d.]+), policy=(\{.*\})")


def parse_estimator_log(log: str) -> dict:
    """Every compile the estimator made (batch, policy, oom), the rows it printed, and where it
    stopped."""
    compiles, pending = [], None
    for line in log.splitlines():
        m = _CHECK.search(line)
        if m:
            pending = {"batch": float(m.group(1)), "policy": ast.literal_eval(m.group(2))}
            continue
        m = _IS_OOM.search(line)
        if m and pending is not None:
            compiles.append(pending | {"oom": m.group(1) == "True"})
            pending = None
    rows = [
        {"batch": float(m.group(1)), "policy": ast.literal_eval(m.group(2))}
        for m in _FOUND.finditer(log)
    ]
    done = re.search(r"Search completed in ([\d.]+) seconds", log)
    return {
        "compiles": compiles,
        "rows": rows,
        "search_s": float(done.group(1)) if done else None,
        "unfinished_compile": pending,
    }


def rows_from_log(compiles: list[dict]) -> list[dict]:
    """Each policy's largest batch that compiled without OOM, in the order the search visited
    policies."""
    best: dict[str, dict] = {}
    for c in compiles:
        if not c["oom"]:
            key = json.dumps(c["policy"], sort_keys=True)
            if key not in best or c["batch"] > best[key]["batch"]:
                best[key] = {"batch": c["batch"], "policy": c["policy"]}
    return list(best.values())


def estimator_record(
    command: str, rc: int | None, wall: float, log: str, timeout_text: str
) -> dict:
    """One estimator.py run as a record: its command, exit status (None: stopped at the time
    limit, ``timeout_text`` says so), wall time, every compile it made and the rows it printed (or,
    where it printed none, its compiles that fitted); where it failed, the last error line of its
    log, the compile it was in and the log's tail."""
    parsed = parse_estimator_log(log)
    out = {
        "command": command,
        "returncode": rc,
        "wall_s": round(wall, 1),
        "compiles": parsed["compiles"],
        "n_compiles": len(parsed["compiles"]),
        "rows_printed": parsed["rows"],
        "search_s": parsed["search_s"],
    }
    if rc != 0:
        pattern = r"Error|RET_CHECK|INTERNAL|Traceback"
        errors = [line for line in log.splitlines() if re.search(pattern, line)]
        out["error"] = (
            timeout_text if rc is None else (errors[-1] if errors else log.strip().splitlines()[-1])
        )
        out["log_tail"] = log[-4000:]
        out["stopped_while"] = parsed["unfinished_compile"]
    out["rows"] = parsed["rows"] or rows_from_log(parsed["compiles"])
    out["rows_source"] = (
        "printed by the estimator"
        if parsed["rows"]
        else "its compiles that fitted (it printed none)"
    )
    return out


def run_estimator(py: str, seq: int, work: pathlib.Path, timeout_s: int) -> dict:
    """The estimator's run, parsed (see :func:`child_env`)."""
    return _run_estimator(py, seq, work, timeout_s, {})


def _run_estimator(py: str, seq: int, work: pathlib.Path, timeout_s: int, extra_env: dict) -> dict:
    argv = [
        py,
        "-m",
        "maxtext.utils.estimator",
        base_yml(py),
        f"model_name={MODEL}",
        f"compile_topology={TOPOLOGY}",
        "compile_topology_num_slices=1",
        f"max_target_length={seq}",
        f"base_output_directory={work / 'out'}",
        "run_name=estimator",
        "dataset_type=synthetic",
        "enable_checkpointing=false",
    ]
    print(f"MaxText estimator, seq {seq}: {' '.join(argv[1:])}", flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=work,
            env=child_env(extra_env),
            stdin=subprocess.DEVNULL,
        )
        log, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        log = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace"
        )
        rc = None
    wall = time.perf_counter() - t0
    env = " ".join(f"{k}={v}" for k, v in extra_env.items())
    command = " ".join([*([env] if env else []), "python", *argv[1:]])
    out = estimator_record(command, rc, wall, log, "timed out")
    full = [
        c["batch"]
        for c in out["compiles"]
        if not c["oom"] and set(c["policy"].values()) == {"remat"}
    ]
    out["full_remat_fits"] = sorted(set(full))
    return out


# --------------------------------------------------------------------------- tierax


def tierax(py: str, *args: str, timeout_s: int = 7200) -> tuple[int, dict | None, str, float]:
    """``tierax ARGS --json`` under ``py`` from this checkout: (exit code, JSON or None, stderr,
    wall s)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [py, "-m", "tierax.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        env=child_env({"PYTHONPATH": str(ROOT / "src")}),
    )
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        doc = None
    return p.returncode, doc, p.stderr, wall


def maxtext_plan_file(policy: dict, path: pathlib.Path) -> tuple[str, list[str]]:
    """A MaxText override file of an estimator policy (decoder_layer_input on device, as the
    estimator sets), and the keys left out: those with no tierax counterpart that Llama does not use
    in MaxText either (kv_proj: a unified key/value projection, share_kv_projections false), which
    MaxText's estimator sets all the same."""
    from tierax.interop import maxtext_keys as K

    unused = [k for k in policy if k in K.NO_COUNTERPART and k != K.CONTEXT]
    lines = ["remat_policy: custom", "hardware: tpu", "decoder_layer_input: device"]
    lines += [f"{k}: {v}" for k, v in policy.items() if k not in unused]
    path.write_text("\n".join(lines) + "\n")
    return str(path), unused


def tokens_per_s(py: str, plan: str, batch: int, seq: int) -> dict:
    rc, doc, err, _ = tierax(
        py, "simulate", *TIERAX_SHAPE, "--seq", str(seq), "--microbatch", str(batch), "--plan", plan
    )
    if rc != 0 or doc is None:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"}
    return {
        "predicted_step_s": doc["step_time_s"],
        "tokens_per_s_per_chip": batch * seq / doc["step_time_s"],
        "predicted_peak_gib": round(doc["peak_device_bytes"] / GIB, 2),
    }


def run_plan_check(py: str, seq: int, work: pathlib.Path) -> dict:
    """``tierax plan --max-microbatch --check`` and its plan's tokens/s under the model."""
    args = [
        "plan",
        *TIERAX_SHAPE,
        "--seq",
        str(seq),
        "--max-microbatch",
        "--check",
        "--out",
        str(work / f"plan-{seq}.yaml"),
    ]
    print(f"tierax, seq {seq}: tierax {' '.join(args)}", flush=True)
    rc, doc, err, wall = tierax(py, *args)
    out = {
        "command": "tierax " + " ".join(args[:-2]),
        "returncode": rc,
        "wall_s": round(wall, 1),
        "result": doc,
        "stderr_tail": err[-3000:],
    }
    if doc is not None and doc.get("plan"):
        mb, plan = doc["plan"]["microbatch"], str(work / f"plan-{seq}.yaml")
        out["tokens"] = tokens_per_s(py, plan, mb, seq)
    return out


def _remat_full(py: str, seq: int, batch: int) -> dict:
    args = [
        "compile",
        *TIERAX_SHAPE,
        "--seq",
        str(seq),
        "--microbatch",
        str(batch),
        "--plan",
        "remat-full",
    ]
    print(f"tierax remat-full at {batch}: tierax {' '.join(args)}", flush=True)
    rc, doc, err, wall = tierax(py, *args)
    row = {"batch": batch, "command": "tierax " + " ".join(args), "returncode": rc}
    row["wall_s"] = round(wall, 1)
    if doc is None:
        return row | {"error": err[-2000:]}
    keys = ("fits", "out_of_memory", "device_peak_bytes", "device_limit_bytes", "compile_time_s")
    return row | {k: doc[k] for k in (*keys, "predicted")}


def run_remat_full(py: str, seq: int, batches: list[int]) -> list[dict]:
    """``tierax compile --plan remat-full`` at each batch, the compiles in parallel (one process
    each: on shared cores a compile is bound by its own thread)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(batches), 1)) as pool:
        return list(pool.map(lambda b: _remat_full(py, seq, b), batches))


def score_maxtext_rows(py: str, seq: int, side: dict, work: pathlib.Path) -> None:
    for k, row in enumerate(side.get("rows", [])):
        plan, unused = maxtext_plan_file(row["policy"], work / f"maxtext-{seq}-{k}.yml")
        row["tokens"] = tokens_per_s(py, plan, int(row["batch"]), seq) | {"keys_left_out": unused}


# --------------------------------------------------------------------------- docs table

DOCS_MARKER = "estimator-peer"  # <!-- estimator-peer:start --> … :end --> on its docs page


def _policy_text(policy: dict) -> str:
    moved = [k for k, v in policy.items() if v != "remat"]
    return "full remat" if not moved else ", ".join(f"{k} {policy[k]}" for k in moved)


def _tok(row: dict) -> str:
    t = row.get("tokens") or {}
    return f"{t['tokens_per_s_per_chip']:,.0f}" if "tokens_per_s_per_chip" in t else "—"


def markdown(doc: dict) -> str:
    """The docs' table of the record (every figure read from it)."""
    out = [
        f"{doc['model']} on {doc['topology']} ({doc['devices']} chips, fsdp={doc['devices']}), "
        "deviceless XLA:TPU; tokens/s per chip under tierax's time model. Generated from "
        "`bench/results/estimator_peer.json` by `python bench/estimator_peer.py --docs`.",
        "",
        "| seq | planner | choice | batch/chip (fits XLA:TPU) | compiles | wall | "
        "tokens/s/chip (model) |",
        "|---|---|---|---|---|---|---|",
    ]
    for seq, case in sorted(doc["cases"].items(), key=lambda kv: -int(kv[0])):
        m = case.get("maxtext")
        if m:
            ended = (
                "finished"
                if m["returncode"] == 0
                else f"stopped on an error after {m['n_compiles']} compiles"
            )
            wall = f"{m['wall_s'] / 60:.1f} min ({ended})"
            for k, row in enumerate(m.get("rows", [])):
                first = k == 0
                out.append(
                    f"| {seq} | {'MaxText estimator' if first else ''} | "
                    f"{_policy_text(row['policy'])} | {int(row['batch'])} | "
                    f"{m['n_compiles'] if first else ''} | {wall if first else ''} | "
                    f"{_tok(row)} |"
                )
        t = case.get("tierax")
        if t and (t.get("plan_check") or {}).get("result"):
            r = t["plan_check"]["result"]
            plan = r["plan"]
            moved = {
                n: v
                for g in plan["plan"]["groups"].values()
                for n, v in g.items()
                if v != "remat" and n not in ("default", "decoder_layer_input")
            }
            choice = ", ".join(f"{n} {v}" for n, v in moved.items()) or "full remat"
            out.append(
                f"| {seq} | tierax `plan --max-microbatch --check` | {choice} | "
                f"{plan['microbatch']} | {r['compiles']} | "
                f"{t['plan_check']['wall_s'] / 60:.1f} min | {_tok(t['plan_check'])} |"
            )
        if t and t.get("remat_full"):
            fits = ", ".join(
                f"{row['batch']}: {'fits' if row.get('fits') else 'does not fit'}"
                + (
                    f" ({row['device_peak_bytes'] / GIB:.1f} GiB)"
                    if row.get("device_peak_bytes")
                    else ""
                )
                for row in t["remat_full"]
            )
            out.append(
                f"| {seq} | tierax `compile --plan remat-full` at MaxText's full-remat fits | "
                f"full remat | {fits} | {len(t['remat_full'])} | — | — |"
            )
    notes = [
        f"- seq {seq}: {case['tierax']['plan_check']['caveat']}"
        for seq, case in sorted(doc["cases"].items(), key=lambda kv: -int(kv[0]))
        if (case.get("tierax", {}).get("plan_check") or {}).get("caveat")
    ]
    return "\n".join(out + ([""] + notes if notes else [])) + "\n"


def write_docs(doc: dict) -> pathlib.Path:
    return _common.write_docs_table(DOCS_MARKER, markdown(doc))


def merge_records(out: pathlib.Path, other: pathlib.Path) -> None:
    """``other``'s cases into ``out``: a side present in ``other`` replaces ``out``'s part by part
    (the tierax side's plan_check; its remat_full rows batch by batch; MaxText's side whole)."""
    doc, new = json.loads(out.read_text()), json.loads(other.read_text())
    for seq, case in new["cases"].items():
        mine = doc["cases"].setdefault(seq, {})
        if "maxtext" in case:
            mine["maxtext"] = case["maxtext"]
        side = mine.setdefault("tierax", {})
        for part, value in case.get("tierax", {}).items():
            if part == "remat_full":  # rows by batch: compiles made in separate runs add up
                rows = {r["batch"]: r for r in side.get(part, [])} | {r["batch"]: r for r in value}
                value = [rows[b] for b in sorted(rows)]
            side[part] = value
    records.write_record(out, doc)
    print(f"merged {other} into {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--venv",
        default=os.path.expanduser("~/.cache/tierax/maxtext-venv"),
        help="MaxText 0.2.5's venv (as bench/maxtext_roundtrip.py makes it)",
    )
    ap.add_argument("--side", choices=("maxtext", "tierax", "all"), default="all")
    ap.add_argument("--seqs", default="8192,4096")
    ap.add_argument("--timeout-s", type=int, default=4 * 3600, help="per MaxText estimator run")
    _common.add_out(ap, "estimator_peer.json")
    ap.add_argument(
        "--docs",
        action="store_true",
        help="only rewrite the docs' estimator-peer table from the record (no compiles)",
    )
    ap.add_argument(
        "--parts",
        default="plan-check,remat-full,score",
        help="tierax side: which of plan-check, remat-full (compiles at MaxText's full-remat "
        "fits, or --batches), score (tokens/s of MaxText's rows) to run",
    )
    ap.add_argument("--batches", help="tierax side: remat-full at these batches (e.g. 8,10,11)")
    ap.add_argument(
        "--merge",
        metavar="RECORD",
        help="merge RECORD's cases (each side and part keeps its own command) into --out and exit",
    )
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    if parts - {"plan-check", "remat-full", "score"}:
        sys.exit(f"--parts takes plan-check, remat-full, score; got {a.parts!r}")
    if a.merge:
        merge_records(pathlib.Path(a.out), pathlib.Path(a.merge))
        return 0
    if a.docs:
        page = write_docs(json.loads(pathlib.Path(a.out).read_text()))
        print(f"{page.relative_to(ROOT)}: table rewritten from {a.out}")
        return 0
    py = str(pathlib.Path(a.venv) / "bin" / "python")
    if not pathlib.Path(py).exists():
        sys.exit(
            f"no MaxText venv at {a.venv}: create it as bench/maxtext_roundtrip.py does "
            "(Python >= 3.12, pip install 'maxtext[tpu]==0.2.5'), then pass --venv"
        )
    out = pathlib.Path(a.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc.setdefault("cases", {})
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the envelope starts JAX: never as a TPU backend
    side_env = records.envelope(SCHEMA, records.command_line(prog="python bench/estimator_peer.py"))
    side_env |= {"machine": records.machine_info(), "versions": versions(py)}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for seq in [int(s) for s in a.seqs.split(",")]:
            case = doc["cases"].setdefault(str(seq), {})
            if a.side in ("maxtext", "all"):
                case["maxtext"] = run_estimator(py, seq, work, a.timeout_s) | {"run": side_env}
                print(
                    json.dumps({k: case["maxtext"][k] for k in ("n_compiles", "wall_s", "rows")}),
                    flush=True,
                )
            if a.side in ("tierax", "all"):
                side = case.setdefault("tierax", {})
                if "plan-check" in parts:
                    side["plan_check"] = run_plan_check(py, seq, work) | {"run": side_env}
                if "remat-full" in parts:
                    given = [int(b) for b in a.batches.split(",")] if a.batches else None
                    fits = (case.get("maxtext") or {}).get("full_remat_fits", [])
                    batches = given or [int(b) for b in fits]
                    side["remat_full"] = run_remat_full(py, seq, batches)
                    side["remat_full_run"] = side_env | {
                        "batches_from": "--batches" if given else "MaxText's full-remat compiles"
                    }
                if "score" in parts and "maxtext" in case:
                    score_maxtext_rows(py, seq, case["maxtext"], work)
            records.write_record(
                out,
                doc
                | {
                    "schema": SCHEMA,
                    "model": MODEL,
                    "topology": TOPOLOGY,
                    "devices": DEVICES,
                    "mesh": {"fsdp": DEVICES},
                },
            )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
