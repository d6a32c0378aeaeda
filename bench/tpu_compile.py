#!/usr/bin/env python3
"""Deviceless XLA:TPU compiles of Llama 3 8B (v5p or v6e) under the planner's plan: peak vs model.

Needs libtpu (the tpu-aot extra, which ``make venv`` installs; ``pip install 'tierax[tpu-aot]'``).
For each case, runs ``tierax plan --out`` (planner cases) or ``tierax simulate`` (fixed plans),
then ``tierax compile --target v5p --json`` on the plan, each in its own process (this
interpreter), and writes one record: command, machine, versions (jax, jaxlib, libtpu), the model's
prediction and XLA's figures per case.  Default cases (8 chips, fsdp=8): the planner's plan at
microbatch 2, 4 and 8 at sequence 8192 and at 8 and 16 at 4096, and remat-full at 4 (nothing
offloaded) as a reference; ``--devices`` and ``--case PLAN:MB:SEQ`` choose others.  A case XLA
refuses (out of memory) is a result.  ``--case PLAN:MB:SEQ:windowed`` compiles with XLA:TPU's own
choice for the head gradient's reduce-scatter (``LIBTPU_INIT_ARGS`` turning the windowed einsum
back on, where tierax's step turns it off: ``tierax.launch.flags.TPU_FLAGS``), as the reference for
what that option costs.

    python bench/tpu_compile.py [--out bench/results/tpu_compile.json] [--devices 8]

The TPU cost-model terms were traced on libtpu 0.0.52 (jax 0.12, MaxText 0.2.5's pin); the model
keys what an older libtpu reports differently on the installed version (tierax.hardware.libtpu).
Run it with the venv whose libtpu is to be checked (``make venv``'s: 0.0.42.1; a jax 0.12 venv's
Python with this checkout on ``PYTHONPATH``: 0.0.52); the record names the libtpu that compiled
it.  ``--target v6e`` compiles for v6e chips instead of v5p.

    python bench/tpu_compile.py --case planner:1:4096 --case planner:2:4096 \
        --case planner:1:8192 --out bench/results/tpu_default_env.json
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import sys
import tempfile

import _common

from tierax.launch import flags as xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA = "tierax.tpu-compile/1"
MODEL = ["--model", "llama3-8b"]
# (plan, microbatch per device, sequence)
CASES = [
    ("planner", 2, 8192),
    ("planner", 4, 8192),
    ("planner", 8, 8192),
    ("remat-full", 4, 8192),
    ("planner", 8, 4096),
    ("planner", 16, 4096),
]
GIB = 2**30
# A case's variant → the libtpu options its processes get instead of tierax's (TPU_FLAGS).
VARIANTS = {"windowed": "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=true"}


class CaseFailed(Exception):
    pass


def _tierax(*args: str, env: dict | None = None) -> tuple[dict, float]:
    p = _common.run(_common.tierax(*args, "--json"), timeout=3600, cwd=ROOT, env=env)
    if p.returncode != 0:
        raise CaseFailed(
            f"tierax {' '.join(args)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}"
        )
    return json.loads(p.stdout), p.wall_s


def _versions() -> dict:
    return _common.versions("jax", "jaxlib", "libtpu", "flax", "optax")


def _gib(n):
    return None if n is None else round(n / GIB, 2)


def case_key(c: dict) -> str:
    variant = f" {c['variant']}" if c.get("variant") else ""
    return f"{c['plan']} mb{c['microbatch']} seq{c['seq']}{variant}"


def run_case(
    plan: str,
    mb: int,
    seq: int,
    shape_base: list[str],
    tmp: str,
    variant: str = "",
    buffers: bool = False,
) -> tuple[dict, dict]:
    """One case: (its full record, its summary).  A failed command is recorded, not fatal.
    ``buffers``: the compile also dumps XLA:TPU's buffer assignment, and the case records its
    preallocated temp (what XLA:TPU allocates and checks against its limit) beside
    memory_analysis()."""
    shape = [*shape_base, "--seq", str(seq), "--microbatch", str(mb)]
    case: dict = {"plan": plan, "microbatch": mb, "seq": seq}
    env = None
    if variant:
        env = {**os.environ, xla_flags.LIBTPU_ARGS: VARIANTS[variant]}
        case |= {"variant": variant, "libtpu_init_args": VARIANTS[variant]}
    else:
        case["libtpu_init_args"] = " ".join(xla_flags.TPU_FLAGS)
    dump = pathlib.Path(tmp) / f"dump-{plan}-{mb}-{seq}{variant}"
    if buffers:
        env = {**(env or os.environ), "XLA_FLAGS": f"--xla_dump_to={dump}"}
    try:
        if plan == "planner":
            plan = str(pathlib.Path(tmp) / f"planner-{mb}-{seq}{variant}.yaml")
            prediction, case["plan_wall_s"] = _tierax("plan", *MODEL, *shape, "--out", plan)
            case |= {"plan_yaml": pathlib.Path(plan).read_text(), "planner_result": prediction}
        else:  # the cost model's prediction for a fixed plan
            simulated, _ = _tierax("simulate", *MODEL, *shape, "--plan", plan)
            case["planner_result"] = {
                "predicted": simulated[0] if isinstance(simulated, list) else simulated
            }
        compiled, case["wall_s"] = _tierax("compile", *MODEL, *shape, "--plan", plan, env=env)
    except CaseFailed as e:
        case["error"] = str(e)
        return case, {"error": str(e).splitlines()[0]}
    case["compile"] = compiled
    summary = {
        "xla_peak_gib": _gib(compiled["device_peak_bytes"]),
        "xla_temp_gib": _gib(compiled["device_temp_bytes"]),
        "limit_gib": _gib(compiled["device_limit_bytes"]),
        "fits": compiled["fits"],
        "out_of_memory": compiled["out_of_memory"],
        "host_temp_gib": _gib(compiled["host_temp_bytes"]),
        "compile_time_s": round(compiled["compile_time_s"], 1),
    }
    pred = case["planner_result"]["predicted"]
    summary["predicted"] = {
        "peak_device_gib": round(pred["peak_device_bytes"] / GIB, 2),
        "host_gib": round(pred["host_bytes"] / GIB, 2),
        "fits": pred["fits"],
        "step_time_s": pred["step_time_s"],
        "tflops_per_device": pred["tflops_per_device"],
    }
    if compiled["device_peak_bytes"]:
        summary["model_error"] = round(
            pred["peak_device_bytes"] / compiled["device_peak_bytes"] - 1, 4
        )
    if buffers and not compiled["out_of_memory"]:
        case["buffer_assignment"] = _assigned(compiled, dump, mb * seq)
        a = case["buffer_assignment"]
        summary["xla_assigned_peak_gib"] = _gib(a["assigned_peak_bytes"])
        summary["model_error_vs_assignment"] = round(_error_vs_assignment(pred, a), 4)
    return case, summary


def _assigned(compiled: dict, dump: pathlib.Path, tokens: int) -> dict:
    """XLA:TPU's buffer assignment of the compiled step: its preallocated temp, the peak it makes
    with the live arguments and outputs, memory_analysis()'s temp less it, and the model's
    libtpu-keyed excess term for this shape (tierax.costmodel.fixed.libtpu_temp_excess_bytes, 0
    on the traced libtpu), so that the model's peak less that term meets the assignment's."""
    import jax.numpy as jnp  # these import JAX: here, not before --help is answered

    from tierax.costmodel import fixed
    from tierax.hardware import libtpu
    from tierax.models import get_config
    from tierax.tracing.program import Head

    heap = _common.preallocated_temp(dump)["preallocated_temp_bytes"]
    live = (
        compiled["device_argument_bytes"]
        + compiled["device_output_bytes"]
        - compiled["device_alias_bytes"]
    )
    cfg = get_config(MODEL[1])
    c_item = jnp.dtype(cfg.dtype).itemsize  # the compute dtype, as the cost model sizes it
    fsdp = compiled["devices"]  # every case's mesh is fsdp over all chips
    older = libtpu.older_than_traced(compiled.get("libtpu_version") or None)
    head = Head(cfg.d_model, cfg.vocab_size)
    excess = fixed.libtpu_temp_excess_bytes(head, c_item, fsdp, tokens) if older else 0
    return {
        "preallocated_temp_bytes": heap,
        "assigned_peak_bytes": live + heap,
        "memory_analysis_temp_over_assignment_bytes": compiled["device_temp_bytes"] - heap,
        "model_libtpu_excess_bytes": excess,
    }


def _error_vs_assignment(pred: dict, assigned: dict) -> float:
    """The model's peak less its libtpu-keyed term, against XLA:TPU's assigned peak, less 1."""
    model = pred["peak_device_bytes"] - assigned["model_libtpu_excess_bytes"]
    return model / assigned["assigned_peak_bytes"] - 1


DOCS_MARKER = "tpu-compile"  # <!-- tpu-compile:start --> … :end --> on its docs page
# Each record's table on its docs page: the libtpu 0.0.52 record, and the default venv's (libtpu
# 0.0.42.1, the libtpu-keyed term of tierax.costmodel.fixed.libtpu_temp_excess_bytes).
DOCS_MARKERS = {
    "tpu_compile.json": DOCS_MARKER,
    "tpu_default_env.json": "tpu-default-env",
    "tpu_default_env_v6e.json": "tpu-default-env-v6e",
}


def merge(out: pathlib.Path, other: pathlib.Path) -> None:
    """``other``'s cases into ``out`` (a case of the same key replaced); each keeps its command."""
    doc, new = json.loads(out.read_text()), json.loads(other.read_text())
    for d in (doc, new):
        for c in d["cases"]:
            c["run"] = c.get("run") or {}
            c["run"].setdefault("command", d["command"])
            c["run"].setdefault("created", d.get("created"))
            c["run"].setdefault("versions", d["versions"])
    keys = {case_key(c) for c in new["cases"]}
    doc["cases"] = [c for c in doc["cases"] if case_key(c) not in keys] + new["cases"]
    doc["summary"] = {k: v for k, v in doc["summary"].items() if k not in keys} | new["summary"]
    doc["merged_from"] = [*doc.get("merged_from", []), new["command"]]
    _common.write_record(out, doc)
    print(f"merged {other} into {out}")


def markdown(doc: dict, record: str = "tpu_compile.json") -> str:
    """The docs' table of the record (every figure read from it); ``record``: its file name under
    bench/results/."""
    libtpu = {c.get("run", {}).get("versions", {}).get("libtpu") for c in doc["cases"]}
    libtpu = sorted(v for v in libtpu if v) or [doc["versions"]["libtpu"]]
    assigned = any("buffer_assignment" in c for c in doc["cases"])
    how = "--docs" if record == "tpu_compile.json" else f"--docs --out bench/results/{record}"
    out = [
        f"Llama 3 8B, {doc['configuration'].split('--target ')[1]}, deviceless XLA:TPU (libtpu "
        f"{', '.join(libtpu)}); generated from `bench/results/{record}` by "
        f"`python bench/tpu_compile.py {how}`.",
        "",
        "| plan | microbatch × seq | offloaded | predicted peak | XLA:TPU peak | model error | "
        "fits XLA's limit |" + (ASSIGNED_HEAD if assigned else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if assigned else ""),
    ]
    for c in sorted(doc["cases"], key=lambda c: (-c["seq"], c["plan"], c["microbatch"])):
        if "compile" not in c:
            out.append(
                f"| {c['plan']} | {c['microbatch']} × {c['seq']} | — | — | failed: "
                f"{c['error'].splitlines()[0][:60]} | — | — |"
            )
            continue
        comp, pred = c["compile"], c["planner_result"]["predicted"]
        groups = (c["planner_result"].get("plan") or {}).get("groups", {})
        off = sorted({n for g in groups.values() for n, v in g.items() if v == "offload"})
        peak = comp["device_peak_bytes"]
        err = f"{pred['peak_device_bytes'] / peak - 1:+.1%}" if peak else "—"
        xla = f"{peak / GIB:.2f} GiB" if peak else "refused"
        if comp["out_of_memory"] and peak:
            xla += " (refused: XLA's stated need)"
        name = c["plan"] + (" (XLA's windowed einsum)" if c.get("variant") == "windowed" else "")
        out.append(
            f"| {name} | {c['microbatch']} × {c['seq']} | {', '.join(off) or 'none'} | "
            f"{pred['peak_device_bytes'] / GIB:.2f} GiB | {xla} | {err} | "
            f"{'yes' if comp['fits'] else 'no'} ({comp['device_limit_bytes'] / GIB:.2f} GiB) |"
            + (_assigned_cells(c, pred) if assigned else "")
        )
    return "\n".join(out) + "\n"


# With --buffers: XLA:TPU's buffer assignment (arguments + preallocated temp) and the model's peak
# less its libtpu-keyed term against it.
ASSIGNED_HEAD = " XLA:TPU buffer assignment | model (less libtpu term) error |"


def _assigned_cells(case: dict, pred: dict) -> str:
    a = case.get("buffer_assignment")
    if not a:
        return " — | — |"
    return f" {a['assigned_peak_bytes'] / GIB:.2f} GiB | {_error_vs_assignment(pred, a):+.1%} |"


def default_env_markdown(doc: dict) -> str:
    """The TPU guide's table of bench/results/tpu_default_env.json (the default venv's libtpu)."""
    return markdown(doc, "tpu_default_env.json")


def v6e_env_markdown(doc: dict) -> str:
    """The TPU guide's table of bench/results/tpu_default_env_v6e.json (v6e, the default venv)."""
    return markdown(doc, "tpu_default_env_v6e.json")


def write_docs(doc: dict, record: str = "tpu_compile.json") -> pathlib.Path:
    return _common.write_docs_table(DOCS_MARKERS[record], markdown(doc, record))


# The splash-attention records' tables: a record this script wrote (tpu_splash.json, libtpu 0.0.52)
# and the default venv's record (tpu_splash_libtpu_0.0.42.1.json, assembled from `tierax plan` and
# `tierax compile` output), each on the TPU guide under its own marker.
SPLASH_MARKERS = {
    SCHEMA: "tpu-splash",
    "tierax.tpu-splash-default-venv/1": "tpu-splash-libtpu-0.0.42",
}


def splash_markdown(doc: dict) -> str:
    """The TPU guide's table of a splash-attention record: per compile, the attention, its Pallas
    custom calls, XLA:TPU's peak beside the model's and whether it fits (every figure read from
    the record)."""
    if doc["schema"] == SCHEMA:
        rows = [
            (f"{c['plan']}, {c['microbatch']} × {c['seq']}", c["compile"]) for c in doc["cases"]
        ]
    else:
        rows = [(c["case"], c["compile"]) for c in doc["cases"]]
    lines = [
        "| case | target, devices | attention | tpu_custom_calls | XLA:TPU peak GiB | "
        "predicted GiB | model error | fits XLA's limit | libtpu |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for label, comp in rows:
        peak, pred = comp["device_peak_bytes"], comp["predicted"]["peak_device_bytes"]
        lines.append(
            f"| {label} | {comp['target']}, {comp['devices']} | {comp['attention']} | "
            f"{comp['tpu_custom_calls']} | {peak / GIB:.2f} | {pred / GIB:.2f} | "
            f"{pred / peak - 1:+.1%} | {'yes' if comp['fits'] else '**no**'} "
            f"({comp['device_limit_bytes'] / GIB:.2f} GiB) | {comp['libtpu_version']} |"
        )
    how = f"`{doc['command']}`" if "command" in doc else "each case's commands are in the record"
    lines += ["", f"{how}; {doc['created'][:10]}, jax {doc['versions']['jax']}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = _common.parser(__doc__, "tpu_compile.json")
    ap.add_argument("--devices", type=int, default=8, help="chips (mesh fsdp=N)")
    ap.add_argument("--target", default="v5p", choices=["v5p", "v6e"], help="TPU generation")
    ap.add_argument(
        "--case",
        action="append",
        metavar="PLAN:MB:SEQ",
        help="a case (planner or a preset, microbatch per chip, sequence); repeatable; "
        "default: the cases above",
    )
    ap.add_argument(
        "--jobs", type=int, default=1, help="cases run at once (each its own processes)"
    )
    ap.add_argument(
        "--buffers",
        action="store_true",
        help="also dump each compile's buffer assignment and record its preallocated temp",
    )
    ap.add_argument("--merge", metavar="RECORD", help="merge RECORD's cases into --out and exit")
    ap.add_argument("--docs", action="store_true", help="only rewrite the docs' table from --out")
    ap.add_argument(
        "--docs-splash",
        metavar="RECORD.json",
        type=_common.docs_record(*SPLASH_MARKERS),
        help="only rewrite the TPU guide's table of this splash-attention record "
        "(tpu_splash.json or tpu_splash_libtpu_0.0.42.1.json)",
    )
    args = ap.parse_args()
    if args.docs_splash:
        doc = args.docs_splash
        page = _common.write_docs_table(SPLASH_MARKERS[doc["schema"]], splash_markdown(doc))
        print(f"{page.relative_to(ROOT)}: table rewritten from the {doc['schema']} record")
        return 0
    if args.merge:
        merge(pathlib.Path(args.out), pathlib.Path(args.merge))
        return 0
    if args.docs:
        name = pathlib.Path(args.out).name
        if name not in DOCS_MARKERS:
            ap.error(f"--docs renders one of {', '.join(DOCS_MARKERS)} (--out), not {name}")
        page = write_docs(json.loads(pathlib.Path(args.out).read_text()), name)
        print(f"{page.relative_to(ROOT)}: table rewritten from {args.out}")
        return 0
    try:
        cases_wanted = [
            (p, int(m), int(q), v[0] if v else "")
            for p, m, q, *v in (c.split(":") for c in args.case or [])
        ] or [(p, m, q, "") for p, m, q in CASES]
    except ValueError:
        ap.error("--case takes PLAN:MICROBATCH:SEQ[:windowed], e.g. planner:4:8192")
    bad = [v for *_, v in cases_wanted if v and v not in VARIANTS]
    if bad:
        ap.error(f"--case variant {bad[0]!r} is not known; the one variant is: windowed")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    target = ["--target", args.target]
    shape_base = [*target, "--devices", str(args.devices), "--mesh", f"fsdp={args.devices}"]
    versions = _versions()
    if versions["libtpu"] is None:
        sys.exit("libtpu is not installed: pip install 'tierax[tpu-aot]'")
    cases, summary = [], {}

    def write() -> None:  # after every case: a run stopped early keeps what it compiled
        doc = _common.envelope(SCHEMA) | {
            "versions": versions,
            "configuration": " ".join([*MODEL, *shape_base]),
            "summary": summary,
            "cases": cases,
        }
        _common.write_record(args.out, doc)

    with tempfile.TemporaryDirectory() as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                pool.submit(
                    run_case, plan, mb, seq, shape_base, tmp, variant, args.buffers
                ): case_key({"plan": plan, "microbatch": mb, "seq": seq, "variant": variant})
                for plan, mb, seq, variant in cases_wanted
            }
            for done in concurrent.futures.as_completed(futures):
                key = futures[done]
                case, summary[key] = done.result()
                cases.append(case)
                print(f"{key:24s} {json.dumps(summary[key])}", flush=True)
                write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
