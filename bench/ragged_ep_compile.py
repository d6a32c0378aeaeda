#!/usr/bin/env python3
"""Grouped-matmul MoE under expert parallelism in XLA:TPU's program: deviceless v5p compiles of a
cut-down DeepSeek-V3 with ``moe_impl=ragged`` on data/fsdp and expert-parallel meshes (the
ring-of-experts form), beside the capacity form on the same expert-parallel mesh.

DeepSeek-V3's layer (d_model 7168, MLA, expert hidden 2048) with 3 layers (1 dense, 2 MoE), 16
routed experts and top-4 routing (so 8 chips hold it; on expert=8 a shard has fewer experts than
a token has choices, the ring's ``min(E/ep, k)``), 1 × 4096 tokens per device on 8 v5p, plan
``minimal`` (the expert GEMMs' outputs kept on device, so the ring's buffers are in the peak):
one ``tierax compile --json`` child process per case, recording XLA's peak beside the cost
model's for the same plan, whether it fits, and the libtpu version; and, from XLA's dump of the
step, the peak XLA:TPU assigns (arguments + the preallocated heap) beside the model's assigned peak
(``tierax simulate``: its peak without the installed libtpu's reported excess).  Goal: every case
compiles and fits; the model's peak within 10 % of XLA's in every case (reported either way).
Writes bench/results/ragged_ep_compile.json.

    .venv/bin/python bench/ragged_ep_compile.py [--out FILE]
    .venv/bin/python bench/ragged_ep_compile.py --docs bench/results/ragged_ep_compile.json
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import _common

GOAL = 0.10
SCHEMA = "tierax.bench.ragged_ep_compile/1"
ARGS = [
    "--model", "deepseek-v3-671b", "--set", "num_layers=3", "--set", "first_dense_layers=1",
    "--set", "num_experts=16", "--set", "num_experts_per_tok=4", "--target", "v5p",
    "--plan", "minimal", "--microbatch", "1", "--seq", "4096",
]  # fmt: skip
CASES = [  # (moe_impl, mesh)
    ("ragged", "fsdp=8"),
    ("ragged", "fsdp=2,expert=4"),
    ("ragged", "expert=8"),
    ("capacity", "fsdp=2,expert=4"),
]
GIB = 2**30
DOCS_MARKER = "ragged-ep-compile"


def compile_case(impl: str, mesh: str, tmp: str) -> dict:
    """One case: the compile (with XLA's dump, for the heap XLA:TPU assigns) and the cost model's
    breakdown for the same flags (its assigned peak: without libtpu's reported excess)."""
    flags = [*ARGS, "--set", f"moe_impl={impl}", "--mesh", mesh, "--json"]
    dump = pathlib.Path(tmp) / f"dump-{impl}-{mesh.replace(',', '-').replace('=', '')}"
    case, r = _common.compile_case(_common.tierax("compile", *flags), env=_common.dump_env(dump))
    if r is None:
        return case
    b, failed = _common.simulate_breakdown(flags)
    if b is None:
        return failed
    heap = _common.preallocated_temp(dump)["preallocated_temp_bytes"]
    assigned = r["device_argument_bytes"] + heap
    return case | {
        "model_peak_phase": r["predicted"].get("peak_phase"),
        "libtpu_version": r.get("libtpu_version"),
        "xla_error": r.get("xla_error", ""),
        "xla_assigned_peak_bytes": assigned,
        "model_assigned_peak_bytes": b["assigned_peak_bytes"],
        "model_reported_excess_bytes": b["reported_excess_bytes"],
        "model_error_vs_assigned": b["assigned_peak_bytes"] / assigned - 1,
    }


def markdown(doc: dict) -> str:
    """The docs table of the record (every figure read from it)."""
    lines = [
        "| moe_impl / mesh | XLA peak GiB | predicted GiB | model error | XLA assigned GiB "
        "(arguments + heap) | model assigned GiB | error | fits | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    lines += _common.case_rows(
        doc["cases"],
        9,
        lambda name, c: (
            f"| {name} | {c['xla_peak_bytes'] / GIB:.2f} | {c['model_peak_bytes'] / GIB:.2f} | "
            f"{c['model_error']:+.1%} | {c['xla_assigned_peak_bytes'] / GIB:.2f} | "
            f"{c['model_assigned_peak_bytes'] / GIB:.2f} | {c['model_error_vs_assigned']:+.1%} | "
            f"{'yes' if c['fits'] else 'no'} | {c['compile_time_s']:.0f} |"
        ),
    )
    first = next((c for c in doc["cases"].values() if not c["returncode"]), {})
    lines += [
        "",
        f"`tierax {first.get('command', '').removeprefix('tierax.cli ')}` (and the same for each "
        f"moe_impl and mesh); {_common.made_by(doc)}, libtpu {first.get('libtpu_version')}; "
        f"goal ({doc['goal']}) met: {'yes' if doc['goal_met'] else 'no'}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = _common.parser(__doc__, "ragged_ep_compile.json")
    _common.add_docs(ap, SCHEMA)
    args = ap.parse_args()
    if args.docs:
        return _common.docs_written(DOCS_MARKER, markdown(args.docs))
    cases = {}
    for impl, mesh in CASES:
        with tempfile.TemporaryDirectory(prefix="tierax-ragged-ep-") as tmp:  # a dump: ~100s of MB
            cases[f"{impl} / {mesh}"] = c = compile_case(impl, mesh, tmp)
        if c["returncode"]:
            print(f"{impl} / {mesh}: failed: {c['error']}", file=sys.stderr)
        else:
            print(
                f"{impl} / {mesh}: XLA peak {c['xla_peak_bytes'] / GIB:.2f} GiB, model "
                f"{c['model_peak_bytes'] / GIB:.2f} GiB ({c['model_error']:+.1%}), fits "
                f"{c['fits']}, compile {c['compile_time_s']:.0f} s",
                flush=True,
            )
    ok = all(c["returncode"] == 0 and c["fits"] for c in cases.values())
    goal = ok and all(abs(c["model_error"]) <= GOAL for c in cases.values())
    doc = _common.envelope(SCHEMA) | {
        "goal": f"every case compiles and fits; model peak within {GOAL:.0%} of XLA's",
        "compiles_and_fits": bool(ok),
        "goal_met": bool(goal),
        "cases": cases,
    }
    _common.write_record(args.out, doc)
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
