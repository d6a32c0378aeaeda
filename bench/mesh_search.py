#!/usr/bin/env python3
"""`tierax plan --mesh auto` on 128 GB200: DeepSeek-V3 671B (global batch 1024 × 4096) and Llama 3.1
405B (256 × 8192), with cuDNN's fused attention (attention=cudnn) and 16 loss tiles, schedule
lhs (lhs-pipelined is not offered with the prefetching scan's offloads).

Each case runs the CLI in a subprocess (the search, its sensitivity to the scale-out and NVLink
rates, the winner's plan file carrying its mesh) and records its JSON, the wall and CPU seconds of
the process and the machine's load around it.  With --compile (DeepSeek-V3 by default) the winner's
plan file is compiled deviceless for gb200 with `tierax compile --plan FILE` and no --mesh: the mesh
comes from the plan file (61 layers, 128 devices).  Cost-model predictions and one deviceless XLA
compile; nothing runs on a GPU.

    .venv/bin/python bench/mesh_search.py            # → bench/results/mesh_search.json
    .venv/bin/python bench/mesh_search.py --docs     # the docs' table, from the record
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "mesh_search.json"
MODEL_SETS = ["--set", "attention=cudnn", "--set", "loss_tiles=16"]
CASES = {  # name: (model, global batch, seq)
    "deepseek-v3-671b": ("deepseek-v3-671b", 1024, 4096),
    "llama3.1-405b": ("llama3.1-405b", 256, 8192),
}
TARGET, DEVICES, SCHEDULE = "gb200", 128, "lhs"


def _cli(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``tierax ARGS``; (process, wall s, CPU s of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-m", "tierax.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def run_case(name: str, compile_winner: bool) -> dict:
    model, gb, seq = CASES[name]
    plan_file = RESULTS / f"mesh_search_{name}_plan.yaml"
    args = [
        "plan",
        "--model",
        model,
        *MODEL_SETS,
        "--target",
        TARGET,
        "--devices",
        str(DEVICES),
        "--mesh",
        "auto",
        "--global-batch",
        str(gb),
        "--seq",
        str(seq),
        "--schedule",
        SCHEDULE,
        "--json",
        "--out",
        str(plan_file),
    ]
    load0 = os.getloadavg()[0]
    proc, wall, cpu = _cli(args, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"tierax {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout)
    case = {
        "case": name,
        "command": "tierax " + " ".join(args),
        "attention": "cudnn",
        "process_wall_s": wall,
        "process_cpu_s": cpu,
        "load_before_after": [load0, os.getloadavg()[0]],
        "plan_file": str(plan_file.relative_to(ROOT)),
        "search": doc,
    }
    if compile_winner:
        best = doc["candidates"][0]
        cargs = [
            "compile",
            "--model",
            model,
            *MODEL_SETS,
            "--target",
            TARGET,
            "--plan",
            str(plan_file),
            "--microbatch",
            str(best["microbatch"]),
            "--seq",
            str(seq),
            "--xla-preset",
            SCHEDULE,
            "--json",
        ]
        proc, cwall, _ = _cli(cargs, timeout=3600)
        if proc.returncode:
            raise SystemExit(f"tierax {' '.join(cargs)} failed:\n{proc.stderr[-3000:]}")
        res = json.loads(proc.stdout)
        case["compile"] = {
            "command": "tierax " + " ".join(cargs),
            "wall_s": cwall,
            "mesh": res["mesh"],
            "devices": res["devices"],
            "fits": res["fits"],
            "device_peak_bytes": res["device_peak_bytes"],
            "device_capacity_bytes": res["device_capacity_bytes"],
            "host_temp_bytes": res.get("host_temp_bytes"),
            "predicted_peak_bytes": best["peak_device_bytes"],
            "compile_time_s": res.get("compile_time_s"),
        }
    return case


def _m(mesh: dict) -> str:
    return ",".join(f"{a}={v}" for a, v in mesh.items() if v > 1) or "1"


def readme(doc: dict) -> str:
    """The docs' tables: the top candidates per case, the sensitivity and the compile."""
    lines = []
    for case in doc["cases"]:
        s = case["search"]
        lines += [
            f"**{case['case']}**, {s['devices']} GB200, global batch {s['global_batch']} × "
            f"{s['seq']}, attention {case['attention']}, {SCHEDULE}: search "
            f"{s['search_wall_s']:.0f} s wall ({case['process_cpu_s']:.0f} s CPU for the whole "
            f"command, load {case['load_before_after'][0]:.1f} → "
            f"{case['load_before_after'][1]:.1f}), {s['candidates_admitted']} meshes, "
            f"{s['planner_solves']} planner solves, {s['no_fit_by_state_bound']} cut by the state "
            f"bound, {s['pruned_by_time_bound']} by the time bound.",
            "",
            "| # | mesh | microbatch × accum | tokens/s | step s | collectives s by group "
            "(* crosses NVLink) | exposed coll. s | peak GiB | host GiB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for i, c in enumerate([c for c in s["candidates"] if c["tokens_per_s"]][: s["top"]], 1):
            coll = ", ".join(
                f"{g} {v:.2f}{'*' if c['links'].get(g, {}).get('crosses_domain') else ''}"
                for g, v in c["collective_s"].items()
            )
            lines.append(
                f"| {i} | {_m(c['mesh'])} | {c['microbatch']} × {c['grad_accum']} | "
                f"{c['tokens_per_s']:,.0f} | {c['step_time_s']:.2f} | {coll} | "
                f"{c['exposed_collective_s']:.2f} | {c['peak_device_bytes'] / 2**30:.1f} | "
                f"{c['host_bytes'] / 2**30:.1f} |"
            )
        lines += ["", f"Why: {s['why']}.", ""]
        for r in s["sensitivity"]:
            lines.append(
                f"- {r['rate']} × {r['factor']:g}: winner {_m(r['winner'])}"
                f"{' (unchanged)' if r['same_winner'] else ''}; today's top {s['top']} rank "
                f"{r['baseline_ranks']}"
            )
        if "compile" in case:
            c = case["compile"]
            lines += [
                "",
                f"Winner compiled deviceless (`{c['command']}`, the mesh from the plan file: "
                f"{_m(c['mesh'])}, {c['devices']} devices): XLA peak "
                f"{c['device_peak_bytes'] / 2**30:.1f} GiB of "
                f"{c['device_capacity_bytes'] / 2**30:.1f} (predicted "
                f"{c['predicted_peak_bytes'] / 2**30:.1f}), fits: {'yes' if c['fits'] else 'no'}.",
            ]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(CASES), help="run one case (default: both)")
    ap.add_argument(
        "--compile",
        choices=[*sorted(CASES), "none"],
        default="deepseek-v3-671b",
        help="the case whose winner is compiled deviceless (default deepseek-v3-671b)",
    )
    ap.add_argument(
        "--docs", action="store_true", help="rewrite the docs' mesh-search table from the record"
    )
    _common.add_out(ap, "mesh_search.json")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    if args.docs:
        page = _common.write_docs_table("mesh-search", readme(json.loads(out.read_text())))
        print(f"{page.relative_to(ROOT)}: table rewritten from {out}")
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from tierax import records

    names = [args.only] if args.only else list(CASES)
    cases = [run_case(n, args.compile == n) for n in names]
    doc = records.envelope(
        "tierax.bench-mesh-search/1", records.command_line(prog="python bench/mesh_search.py")
    ) | {
        "note": "cost-model predictions (tierax plan --mesh auto) and one deviceless XLA:GPU "
        "compile; search_wall_s is the search and its sensitivity inside the CLI, process_wall_s "
        "the whole command (JAX start included) on this shared machine",
        "cases": cases,
    }
    records.write_record(out, doc)
    print(readme(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
