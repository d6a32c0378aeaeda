#!/usr/bin/env python3
"""MaxText's estimator vs ``tierax plan --maxtext --max-microbatch --check`` on MaxText's own
program: compiles used, wall time, the batch and policy each finds, and each choice's predicted
step time and tokens/s per chip under tierax's model.

Configurations MaxText documents (its model files), cut to what compiles on a CPU machine in under
a minute (``override_model_config=true base_num_decoder_layers=2``), on ``compile_topology=v5p-8``
(4 chips, MaxText's default mesh fsdp=4); every compile is MaxText's own deviceless XLA:TPU compile.

* ``--side maxtext``: ``python -m maxtext.utils.estimator`` (greedy remat → offload → device per
  tensor, each policy's batch found by a binary search of compile-and-OOM, no time model), parsed
  from its log (:mod:`estimator_peer`'s parser): every compile, the rows it printed, its wall time,
  and the error or time limit it stopped on, if any.  Each row is priced by ``tierax simulate
  --maxtext`` of its policy at its batch (read as MaxText keys).
* ``--side tierax``: ``tierax plan --maxtext ... --max-microbatch --check --emit maxtext``: the
  model's largest batch and its plan, confirmed by MaxText compiles (the last compile of the plan
  it reports is MaxText's own compile of the emitted keys).
* ``--docs RECORD``: the page's table from the record (nothing run).

Each side of each case merges into the record (``bench/results/estimator_maxtext.json``) as it
finishes.  Tens of minutes per case on 2 shared cores (the estimator: tens of compiles).

    python bench/estimator_maxtext.py [--side maxtext|tierax|all] [--cases llama3-8b,...]
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

import _common
import _maxtext
from estimator_peer import estimator_record

SCHEMA = "tierax.estimator-maxtext/1"
TOPOLOGY, DEVICES, TARGET, LAYERS = "v5p-8", 4, "v5p", 2
# name, MaxText model file, sequence
CASES = (
    ("llama3-8b", "llama3-8b", 8192),
    ("mistral-7b", "mistral-7b", 8192),
    ("qwen3-8b", "qwen3-8b", 8192),
)
DOCS_MARKER = "estimator-maxtext"
GIB = 2**30


def case_keys(model: str, seq: int) -> list[str]:
    """The MaxText keys both sides share (no batch: each side searches it); the slice is
    ``--target``/``--devices`` on tierax's side, :func:`topology_keys` on the estimator's."""
    return [
        f"model_name={model}",
        "override_model_config=true",
        f"base_num_decoder_layers={LAYERS}",
        f"max_target_length={seq}",
        "dataset_type=synthetic",
        "enable_checkpointing=false",
    ]


def topology_keys() -> list[str]:
    """The estimator's slice: MaxText's deviceless compile for the topology."""
    return [f"compile_topology={TOPOLOGY}", "compile_topology_num_slices=1"]


def tierax_shape() -> list[str]:
    return ["--target", TARGET, "--devices", str(DEVICES)]


# --------------------------------------------------------------------------- MaxText's estimator


def run_estimator(name: str, model: str, seq: int, timeout_s: float, log_path: str) -> dict:
    """The estimator's run, its log streamed to ``log_path`` (to watch it), parsed."""
    with tempfile.TemporaryDirectory(prefix="tierax-estimator-") as tmp:
        argv = [
            sys.executable,
            "-m",
            "maxtext.utils.estimator",
            _maxtext.base_yml(),
            *case_keys(model, seq),
            *topology_keys(),
            f"base_output_directory={tmp}/out",
            "run_name=estimator",
        ]
        print(f"{name}: MaxText estimator: {' '.join(argv[1:])}", file=sys.stderr, flush=True)
        env = _maxtext.env() | {"PYTHONUNBUFFERED": "1"}
        t0 = time.perf_counter()
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
        wall = time.perf_counter() - t0
    log = pathlib.Path(log_path).read_text(errors="replace")
    command = "python " + " ".join(argv[1:-2]).replace(
        _maxtext.base_yml(), "<maxtext>/configs/base.yml"
    )
    limit = f"stopped at the bench's time limit ({timeout_s:.0f} s)"
    return estimator_record(command, rc, wall, log, limit)


def price_row(model: str, seq: int, row: dict) -> dict:
    """``tierax simulate --maxtext`` of an estimator row: its policy at its batch (MaxText keys)."""
    keys = [
        *case_keys(model, seq),
        f"per_device_batch_size={row['batch']:g}",
        "remat_policy=custom",
        *(f"{k}={v}" for k, v in row["policy"].items()),
    ]
    argv = ["simulate", "--maxtext", _maxtext.base_yml(), *keys, *tierax_shape(), "--json"]
    r = _common.run(_common.tierax(*argv), env=_maxtext.env(), timeout=1800, cwd=_common.ROOT)
    cmd = "tierax " + " ".join(argv).replace(_maxtext.base_yml(), "<maxtext>/configs/base.yml")
    if r.returncode != 0:
        return {
            "command": cmd,
            "error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1],
        }
    doc = json.loads(r.stdout[r.stdout.index("{") :])
    step = doc["step_time_s"]
    return {
        "command": cmd,
        "predicted_step_s": step,
        "tokens_per_s_per_chip": row["batch"] * seq / step,
        "predicted_peak_gib": round(doc["peak_device_bytes"] / GIB, 2),
    }


# --------------------------------------------------------------------------- tierax


def run_tierax(name: str, model: str, seq: int, work: pathlib.Path) -> dict:
    """``tierax plan --maxtext ... --max-microbatch --check --emit maxtext --json``."""
    out_file = work / f"{name}-plan.yml"
    argv = [
        "plan",
        "--maxtext",
        _maxtext.base_yml(),
        *case_keys(model, seq),
        *tierax_shape(),
        "--max-microbatch",
        "--check",
        "--emit",
        "maxtext",
        "--out",
        str(out_file),
        "--json",
    ]
    print(f"{name}: tierax {' '.join(argv)}", file=sys.stderr, flush=True)
    r = _common.run(_common.tierax(*argv), env=_maxtext.env(), timeout=3600, cwd=_common.ROOT)
    cmd = "tierax " + " ".join(argv[:-3] + ["--out", "plan.yml"])
    cmd = cmd.replace(_maxtext.base_yml(), "<maxtext>/configs/base.yml")
    out = {"command": cmd, "returncode": r.returncode, "wall_s": round(r.wall_s, 1)}
    try:
        doc = json.loads(r.stdout[r.stdout.index("{") :])  # MaxText may print lines before it
    except ValueError:
        return out | {
            "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no output"
        }
    search = doc.get("max_microbatch") or {}
    out |= {
        "batch": search.get("per_device_batch_size"),
        "model_batch": search.get("model_per_device_batch_size"),
        "traces": search.get("traces"),
        "compiles": doc.get("compiles"),
        "batches_checked": search.get("batches_checked"),
        "converged": doc.get("converged"),
        # the plan written is the last whose MaxText compile fitted: MaxText's own compile of the
        # emitted keys
        "maxtext_compile_fits": bool(doc.get("fitted_iteration")),
        "policy": search.get("policy"),
        "overrides": doc.get("overrides"),
        "predicted_step_s": search.get("predicted_step_s"),
        "tokens_per_s_per_chip": search.get("tokens_per_s_per_chip"),
        "iterations": doc.get("iterations"),
        "notes": doc.get("notes"),
        "stderr_tail": r.stderr[-2000:],
    }
    return out


# --------------------------------------------------------------------------- docs


def _policy_text(policy: dict) -> str:
    """The names not rematerialized (the scan's carry, decoder_layer_input, is on device on both
    sides and left out)."""
    moved = {k: v for k, v in sorted(policy.items()) if v != "remat" and k != "decoder_layer_input"}
    return ", ".join(f"{k} {v}" for k, v in moved.items()) or "all remat"


def _tok(d: dict | None) -> str:
    d = d or {}
    if "tokens_per_s_per_chip" not in d or d["tokens_per_s_per_chip"] is None:
        return "—"
    return f"{d['predicted_step_s'] * 1e3:,.0f} ms · {d['tokens_per_s_per_chip']:,.0f}"


def best_row(side: dict) -> dict | None:
    """The estimator's row with the most tokens/s per chip under tierax's model."""
    rows = [r for r in side.get("rows", []) if (r.get("tierax") or {}).get("tokens_per_s_per_chip")]
    return max(rows, key=lambda r: r["tierax"]["tokens_per_s_per_chip"], default=None)


def render(doc: dict) -> str:
    out = [
        f"Every compile MaxText's own deviceless XLA:TPU compile for {doc['topology']} "
        f"({doc['devices']} chips, fsdp={doc['devices']}) on a {doc['machine'].get('cores')}-core "
        "CPU machine shared with other work; step times and tokens/s are tierax's predictions (no "
        "TPU). The estimator's row shown is the one tierax's model prices fastest among the rows "
        "it found (all rows below).",
        "",
        "| configuration | planner | batch/chip | policy (not remat) | compiles | wall | "
        "MaxText compile of the choice | predicted step · tokens/s/chip |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows_table, commands, checks = [], [], []
    for case in doc["cases"]:
        label = f"{case['name']} ({LAYERS} layers, seq {case['seq']})"
        m = case.get("maxtext")
        if m:
            ended = "finished" if m["returncode"] == 0 else m.get("error", "stopped")
            best = best_row(m)
            rows = m.get("rows", [])
            out.append(
                f"| {label} | MaxText estimator ({ended}) | "
                + (f"{best['batch']:g} | {_policy_text(best['policy'])}" if best else "— | —")
                + f" | {m['n_compiles']} | {m['wall_s'] / 60:.1f} min | fits (its own probe) | "
                f"{_tok(best and best['tierax'])} |"
            )
            for row in rows:
                rows_table.append(
                    f"| {case['name']} | {row['batch']:g} | {_policy_text(row['policy'])} | "
                    f"{(row.get('tierax') or {}).get('predicted_peak_gib', '—')} | "
                    f"{_tok(row.get('tierax'))} |"
                )
            commands.append(f"- {case['name']}, estimator: `{m['command']}`")
        t = case.get("tierax")
        if t:
            fits = "fits" if t.get("maxtext_compile_fits") else "—"
            err = f" (exit {t['returncode']}: {t['error']})" if t.get("error") else ""
            done = "" if t.get("converged") or t.get("error") else " (model not within 5 %)"
            out.append(
                f"| {label} | tierax `plan --maxtext --max-microbatch --check`{err}{done} | "
                f"{t['batch'] if t.get('batch') is not None else '—'} | "
                f"{_policy_text(t['policy']) if t.get('policy') else '—'} | "
                f"{t.get('compiles', '—')} | {t['wall_s'] / 60:.1f} min | {fits} | {_tok(t)} |"
            )
            commands.append(f"- {case['name']}, tierax: `{t['command']}`")
            if t.get("batches_checked"):
                steps = ", ".join(
                    f"{c['per_device_batch_size']:g} ("
                    + (
                        "no plan by the corrected model, not compiled"
                        if not c["compiles"]
                        else f"{'fits' if c['fits'] else 'does not fit'}, {c['compiles']} "
                        "compile(s)"
                    )
                    + ")"
                    for c in t["batches_checked"]
                )
                checks.append(
                    f"- {case['name']}: the model's largest {t['model_batch']:g} "
                    f"({t['traces']} traces); MaxText's compile at {steps}"
                )
    out += [
        "",
        "Every row the estimator found (its printed rows, or, where it stopped, each policy's "
        "largest batch that fitted), priced by `tierax simulate --maxtext` (its predicted peak "
        "beside the batch MaxText's compile fitted):",
        "",
        "| configuration | batch/chip | policy (not remat) | tierax's predicted peak (GiB) | "
        "predicted step · tokens/s/chip |",
        "|---|---|---|---|---|",
        *rows_table,
        "",
        "The batches tierax's search checked, in order (each batch's plan compiled, and once "
        "more with that compile's correction where it did not fit):",
        "",
        *checks,
        "",
        "Commands (`<maxtext>`: the installed MaxText package):",
        "",
        *commands,
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "estimator_maxtext.json")
    ap.add_argument(
        "--side",
        choices=("maxtext", "tierax", "all", "price"),
        default="all",
        help="price: only price the recorded estimator rows again under tierax's model",
    )
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--timeout-s", type=float, default=3600, help="per estimator run")
    ap.add_argument("--log-dir", default=tempfile.gettempdir(), help="where the estimator logs go")
    _common.add_docs(ap, SCHEMA)
    a = ap.parse_args(argv)
    if a.docs is not None:
        return _common.docs_written(DOCS_MARKER, render(a.docs))
    wanted = _maxtext.selected(ap, a.cases, CASES)
    out = pathlib.Path(a.out)
    doc = json.loads(out.read_text()) if out.exists() else {"cases": []}
    doc |= _common.envelope(SCHEMA) | {
        "versions": _common.versions("maxtext", "jax", "jaxlib", "libtpu"),
        "topology": TOPOLOGY,
        "devices": DEVICES,
        "layers": LAYERS,
    }
    by_name = {c["name"]: c for c in doc["cases"]}
    with tempfile.TemporaryDirectory(prefix="tierax-estimator-maxtext-") as tmp:
        for name, model, seq in CASES:
            if name not in wanted:
                continue
            case = by_name.setdefault(name, {"name": name, "model_file": model, "seq": seq})
            case["keys"] = case_keys(model, seq)
            if a.side == "price" and "maxtext" in case:
                for row in case["maxtext"]["rows"]:
                    row["tierax"] = price_row(model, seq, row)
            if a.side in ("maxtext", "all"):
                log = str(pathlib.Path(a.log_dir) / f"estimator_{name}.log")
                m = run_estimator(name, model, seq, a.timeout_s, log)
                m["bench_command"] = _common.command_line(argv)
                for row in m["rows"]:
                    row["tierax"] = price_row(model, seq, row)
                case["maxtext"] = m
            if a.side in ("tierax", "all"):
                case["tierax"] = run_tierax(name, model, seq, pathlib.Path(tmp))
                case["tierax"]["bench_command"] = _common.command_line(argv)
            doc["cases"] = [by_name[c[0]] for c in CASES if c[0] in by_name]
            _common.write_record(out, doc)
            print(f"{name}: written to {out}", file=sys.stderr, flush=True)
    if _common.docs_follow(out, "estimator_maxtext.json"):
        _common.write_docs_table(DOCS_MARKER, render(doc))
    else:
        print(f"docs table left as it is (--docs {out} rewrites it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
