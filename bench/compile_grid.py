#!/usr/bin/env python3
"""Deviceless GPU compile grid: real XLA:GPU memory figures and static overlap for 11 cases.

Each case runs `tierax compile --json` in its own process (XLA flag presets apply per
process), on this machine's CPU with compile-only GPU devices.  Writes one JSON record
(command, machine, versions, every case's result) and prints a table.

    .venv/bin/python bench/compile_grid.py [--out bench/results/compile_grid.json] [--quick]
    .venv/bin/python bench/compile_grid.py --scale [--out bench/results/compile_scale.json]
    .venv/bin/python bench/compile_grid.py --docs bench/results/compile_cudnn.json  # a docs table

``--scale``: the seed's configuration at full size — DeepSeek-V3 671B (all 61 layers) on 128
GB200s, mesh fsdp=16,expert=8 (expert-parallel MoE), 8 × 4096 per device, loss in 16 tiles —
under remat-full, an offload plan and the planner's own plan (``tierax plan --out``), each with
the compile's wall time and peak RAM (the child's max RSS) and the cost model's prediction.

``--scale-dense`` (→ bench/results/compile_scale_dense.json): the dense seed case, Llama 3.1 405B on
GB200s, 2 × 8192 per device, q/k/v offloaded — 128 devices fsdp=128, 128 with a tensor axis
(fsdp=16,tensor=8), 1024 devices fsdp=1024 (2 and 1 sequences per device) — and the planner's plan
at 128 fsdp=128. Every case records the predicted peak's and host bytes' error against XLA's.

``--cudnn`` (→ bench/results/compile_cudnn.json): attention=cudnn (cuDNN's fused flash attention, as
GPU trainers run it) — Llama 3 8B (32 layers) on one H200 at 2 × 4096 and DeepSeek-V3 (2 dense + 3
MoE layers) on 8 GB200 at 1 × 4096, each beside its blockwise twin, and the 61-layer DeepSeek-V3 on
128 GB200 (fsdp=16,expert=8, 8 × 4096) under the published offload policy and the planner's plan.
XLA's peak there includes cuDNN's backward workspace computed from shapes (a deviceless compile
counts it as 0).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import _common
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

# DeepSeek-V3 shapes at reduced depth (2 dense + 3 MoE layers: each group a real loop).
DSV3_SHORT = _common.DEEPSEEK_V3_5_LAYERS[2:]

# lhs-pipelined is not offered with the prefetching scan's offloads (tierax.plan.REFUSED_PRESETS;
# its cases are in bench/hide_grid.py's record).
CASES = [
    # model args, plan, target, extra args
    (["--model", "llama3-8b"], "save-all", "h100", ["--microbatch", "1", "--seq", "4096"]),
    (["--model", "llama3-8b"], "minimal", "h100", ["--microbatch", "1", "--seq", "4096"]),
    (["--model", "llama3-8b"], "remat-full", "h100", ["--microbatch", "1", "--seq", "4096"]),
    (["--model", "llama3-8b"], "qkv-offload", "h100", ["--microbatch", "1", "--seq", "4096"]),
    (["--model", "llama3-8b"], "qkv-offload", "h200", ["--microbatch", "2", "--seq", "4096"]),
    (
        ["--model", "llama3-8b"],
        "qkv-offload",
        "h200",
        ["--microbatch", "2", "--seq", "4096", "--xla-preset", "lhs"],
    ),
    (["--model", "llama3-8b"], "deepseek-offload", "b200", ["--microbatch", "4", "--seq", "2048"]),
    (
        ["--model", "llama3-8b"],
        "qkv-offload",
        "gb200",
        ["--microbatch", "4", "--seq", "2048", "--mesh", "fsdp=8"],
    ),
    (
        ["--model", "deepseek-v3-671b", *DSV3_SHORT],
        "remat-full",
        "gb200",
        ["--microbatch", "1", "--seq", "2048", "--mesh", "fsdp=8"],
    ),
    (
        ["--model", "deepseek-v3-671b", *DSV3_SHORT],
        "deepseek-offload",
        "gb200",
        ["--microbatch", "1", "--seq", "2048", "--mesh", "fsdp=8"],
    ),
    (
        ["--model", "deepseek-v3-671b", *DSV3_SHORT],
        "minimal",
        "b200",
        ["--microbatch", "1", "--seq", "2048", "--mesh", "fsdp=8"],
    ),
]

SCALE_MODEL = ["--model", "deepseek-v3-671b", "--set", "loss_tiles=16"]
SCALE_SHAPE = _common.SEED_SCALE_SHAPE
PLANNER_PLAN = "planner"  # placeholder: the plan `tierax plan` chooses for the scale configuration
SCALE = [
    (SCALE_MODEL, "remat-full", "gb200", SCALE_SHAPE),
    (SCALE_MODEL, "deepseek-offload", "gb200", SCALE_SHAPE),
    (SCALE_MODEL, PLANNER_PLAN, "gb200", SCALE_SHAPE),
]

DENSE_MODEL = ["--model", "llama3.1-405b"]
DENSE_128 = ["--devices", "128", "--mesh", "fsdp=128", "--microbatch", "2", "--seq", "8192"]
SCALE_DENSE = [
    (DENSE_MODEL, "qkv-offload", "gb200", DENSE_128),
    (
        DENSE_MODEL,
        "qkv-offload",
        "gb200",
        ["--devices", "128", "--mesh", "fsdp=16,tensor=8", "--microbatch", "2", "--seq", "8192"],
    ),
    (
        DENSE_MODEL,
        "qkv-offload",
        "gb200",
        ["--devices", "1024", "--mesh", "fsdp=1024", "--microbatch", "2", "--seq", "8192"],
    ),
    (
        DENSE_MODEL,
        "qkv-offload",
        "gb200",
        ["--devices", "1024", "--mesh", "fsdp=1024", "--microbatch", "1", "--seq", "8192"],
    ),
    (DENSE_MODEL, PLANNER_PLAN, "gb200", DENSE_128),
]

# cuDNN's fused attention in the step (attention=cudnn): Llama 3 8B (32 layers) on one H200 at 2 ×
# 4096, the 5-layer DeepSeek-V3 on 8 GB200 at 1 × 4096, each beside its blockwise twin, and the
# 61-layer DeepSeek-V3 on 128 GB200 under the planner's plan and the published offload policy.
CUDNN_SET = ["--set", "attention=cudnn"]
BLOCKWISE_SET = ["--set", "attention=blockwise"]
LLAMA_2X4096 = ["--microbatch", "2", "--seq", "4096"]
DSV3_8 = ["--mesh", "fsdp=8", "--microbatch", "1", "--seq", "4096"]
CUDNN = [
    (["--model", "llama3-8b", *CUDNN_SET], "remat-full", "h200", LLAMA_2X4096),
    (["--model", "llama3-8b", *CUDNN_SET], "qkv-offload", "h200", LLAMA_2X4096),
    (["--model", "llama3-8b", *BLOCKWISE_SET], "qkv-offload", "h200", LLAMA_2X4096),
    (["--model", "deepseek-v3-671b", *DSV3_SHORT, *CUDNN_SET], "remat-full", "gb200", DSV3_8),
    (["--model", "deepseek-v3-671b", *DSV3_SHORT, *CUDNN_SET], "deepseek-offload", "gb200", DSV3_8),
    (
        ["--model", "deepseek-v3-671b", *DSV3_SHORT, *BLOCKWISE_SET],
        "deepseek-offload",
        "gb200",
        DSV3_8,
    ),
    ([*SCALE_MODEL, *CUDNN_SET], "deepseek-offload", "gb200", SCALE_SHAPE),
    ([*SCALE_MODEL, *CUDNN_SET], PLANNER_PLAN, "gb200", SCALE_SHAPE),
]

QUICK = [
    (["--model", "tiny-llama"], "qkv-offload", "h200", []),
    (["--model", "tiny-deepseek"], "deepseek-offload", "gb200", ["--mesh", "fsdp=2"]),
]


def _run(cmd: list[str], timeout: float = 900) -> tuple[int, str, str, float, int]:
    """(returncode, stdout, stderr, wall seconds, the child's peak RSS in bytes)."""
    r = _common.run(cmd, timeout=timeout)
    return r.returncode, r.stdout, r.stderr, r.wall_s, r.peak_rss_bytes


def run_case(model_args, plan, target, extra) -> dict:
    cmd = _common.tierax(
        "compile",
        *model_args,
        "--plan",
        plan,
        "--target",
        target,
        *extra,
        "--json",
    )
    code, out, err, wall, rss = _run(cmd)
    case = {"args": cmd[3:], "wall_s": wall, "max_rss_bytes": rss}
    if code != 0:
        case["error"] = (err.strip().splitlines() or ["(no output)"])[-1]
        return case
    case["result"] = json.loads(out)
    return case


def planner_plan(model_args, target, extra, path: pathlib.Path) -> dict:
    """Run `tierax plan --out path` for the configuration; its prediction and timing."""
    cmd = _common.tierax(
        "plan",
        *model_args,
        "--target",
        target,
        *extra,
        "--out",
        str(path),
        "--json",
    )
    code, out, err, wall, rss = _run(cmd)
    if code != 0:
        return {
            "args": cmd[3:],
            "wall_s": wall,
            "error": (err.strip().splitlines() or ["(no output)"])[-1],
        }
    return {"args": cmd[3:], "wall_s": wall, "result": json.loads(out)}


def predicted(model_args, plan: str, target: str, extra) -> dict:
    """`tierax simulate --json` for the same case (the cost model's peak and host bytes); an XLA
    preset becomes
    the schedule the model has for it (XLA's latency-hiding scheduler runs by default: none →
    lhs)."""
    extra = list(extra)
    schedule = "lhs"
    if "--xla-preset" in extra:
        k = extra.index("--xla-preset")
        schedule = {"none": "lhs"}.get(extra[k + 1], extra[k + 1])
        del extra[k : k + 2]
    cmd = _common.tierax(
        "simulate",
        *model_args,
        "--plan",
        plan,
        "--target",
        target,
        *extra,
        "--schedule",
        schedule,
        "--json",
    )
    code, out, err, _, _ = _run(cmd)
    if code != 0:
        return {"error": (err.strip().splitlines() or ["(no output)"])[-1]}
    return json.loads(out)


def _exposure_agreement(case: dict) -> dict | None:
    """The cost model's exposed transfer time against the static check's, as a share of the
    predicted step
    (issue 12's criterion: within 10 % of step time)."""
    pred, res = case.get("predicted") or {}, case.get("result")
    if res is None or "breakdown" not in pred:
        return None
    model = pred["breakdown"]["exposed_d2h_s"] + pred["breakdown"]["exposed_h2d_s"]
    xla = res["overlap"]["est_exposed_s"]
    step = pred["step_time_s"]
    return {
        "model_exposed_s": model,
        "xla_exposed_s": xla,
        "predicted_step_s": step,
        "difference_share_of_step": abs(model - xla) / step if step else None,
    }


def _errors(case: dict) -> dict | None:
    """The prediction's relative errors against XLA's compile: peak device bytes and host bytes."""
    pred, res = case.get("predicted") or {}, case.get("result")
    if res is None or "peak_device_bytes" not in pred:
        return None
    host = res["host_temp_bytes"]
    return {
        "peak": pred["peak_device_bytes"] / res["device_peak_bytes"] - 1,
        "host": (pred["host_bytes"] / host - 1)
        if host
        else (0.0 if pred["host_bytes"] == 0 else None),
    }


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


# The docs' table of each mode's record, by the mode's option in the record's command.
DOCS_MARKERS = {
    "--cudnn": "compile-cudnn",
    "--scale-dense": "compile-scale-dense",
    "--scale": "compile-scale",
}


def docs_marker(doc: dict) -> str:
    words = doc["command"].split()
    for option, marker in DOCS_MARKERS.items():
        if option in words:
            return marker
    return "compile-grid"


def _case_label(args: list[str], devices: int | None) -> str:
    """A case's configuration from its ``tierax compile`` arguments (``devices``: the compile's)."""
    opts, sets, k = {}, [], 0
    while k < len(args):
        valued = args[k].startswith("--") and k + 1 < len(args) and not args[k + 1].startswith("--")
        if valued and args[k] == "--set":
            sets.append(args[k + 1])
        elif valued:
            opts[args[k]] = args[k + 1]
        k += 2 if valued else 1
    plan = opts["--plan"]
    plan = f"the planner's plan (`{pathlib.Path(plan).name}`)" if plan.endswith(".yaml") else plan
    devices = devices or opts.get("--devices", "1")
    mesh = f", {opts['--mesh']}" if "--mesh" in opts else ""
    over = f" ({', '.join(sets)})" if sets else ""
    preset = f", XLA preset {opts['--xla-preset']}" if "--xla-preset" in opts else ""
    return (
        f"{opts['--model']}{over}, {devices} {opts['--target']}{mesh}, "
        f"{opts['--microbatch']} × {opts['--seq']}, {plan}{preset}"
    )


def markdown(doc: dict) -> str:
    """The docs table of a record: per case, XLA's peak beside the model's, the host bytes, the
    cuDNN calls and the compile's cost (every figure read from the record)."""
    lines = [
        "| case | XLA peak / capacity GiB | predicted GiB (error) | host: XLA / predicted GiB | "
        "exposed transfers ms: model / static check (difference, share of step) | cuDNN calls | "
        "compile wall s | RAM GB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in doc["cases"]:
        res, pred = c.get("result"), c.get("predicted") or {}
        label = _case_label(c["args"], (res or {}).get("devices"))
        if res is None:
            lines.append(f"| {label} | failed: {c.get('error', '')[:100]} | | | | | | |")
            continue
        fits = " (fits)" if res["fits"] else " (**does not fit**)"
        peak = f"{gib(res['device_peak_bytes'])} / {gib(res['device_capacity_bytes'])}{fits}"
        err = c.get("prediction_error") or {}
        if "peak_device_bytes" in pred:
            model = f"{gib(pred['peak_device_bytes'])} ({err.get('peak', 0):+.1%})"
            host = f"{gib(res['host_temp_bytes'])} / {gib(pred['host_bytes'])}"
        else:
            model, host = f"— ({pred.get('error', '')[:60]})", f"{gib(res['host_temp_bytes'])} / —"
        agree = c.get("exposure_agreement")
        exposed = (
            f"{agree['model_exposed_s'] * 1e3:.1f} / {agree['xla_exposed_s'] * 1e3:.1f} "
            f"({agree['difference_share_of_step']:.1%})"
            if agree and agree.get("difference_share_of_step") is not None
            else "—"
        )
        lines.append(
            f"| {label} | {peak} | {model} | {host} | {exposed} | {res.get('cudnn_calls', 0)} | "
            f"{c['wall_s']:.0f} | {c['max_rss_bytes'] / 1e9:.2f} |"
        )
    lines += ["", f"{_common.made_by(doc)}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--docs",
        metavar="RECORD.json",
        type=_common.docs_record("tierax.compile_grid/1"),
        help="rewrite the docs table of this record (compile_cudnn, compile_scale or "
        "compile_scale_dense) and exit (nothing is compiled)",
    )
    ap.add_argument(
        "--out",
        type=_common.out_path,
        metavar="FILE.json",
        help="the record to write (default: bench/results/compile_grid.json, or the mode's record)",
    )
    _common.add_quick(ap, "two tiny cases")
    ap.add_argument(
        "--scale",
        action="store_true",
        help="DeepSeek-V3 671B, 128 GB200, fsdp=16,expert=8: remat-full, an offload plan, the "
        "planner's plan",
    )
    ap.add_argument(
        "--scale-dense",
        action="store_true",
        help="Llama 3.1 405B on GB200: 128 fsdp, 128 fsdp×tensor, 1024 fsdp, the planner's plan at "
        "128",
    )
    ap.add_argument(
        "--cudnn",
        action="store_true",
        help="attention=cudnn: Llama 3 8B on H200, 5- and 61-layer DeepSeek-V3 on GB200 (with the "
        "planner's plan), beside blockwise twins",
    )
    args = ap.parse_args()
    if args.docs:
        doc = args.docs
        print(f"wrote {_common.write_docs_table(docs_marker(doc), markdown(doc))}")
        return 0
    record = (
        "compile_cudnn"
        if args.cudnn
        else "compile_scale_dense"
        if args.scale_dense
        else "compile_scale"
        if args.scale
        else None
    )
    if args.out is None:
        args.out = _common.out_path(str(_common.RESULTS / f"{record or 'compile_grid'}.json"))
    cases = (
        QUICK
        if args.quick
        else CUDNN
        if args.cudnn
        else SCALE_DENSE
        if args.scale_dense
        else SCALE
        if args.scale
        else CASES
    )
    results = []
    plan_dir = pathlib.Path(args.out).parent
    with Progress() as prog:
        task = prog.add_task("compiling", total=len(cases))
        for model_args, plan, target, extra in cases:
            prog.update(
                task, description=f"{' '.join(model_args[1:])} {plan} {target} {' '.join(extra)}"
            )
            planner = None
            if plan == PLANNER_PLAN:
                path = plan_dir / f"{record or 'compile_grid'}_planner_plan.yaml"
                planner = planner_plan(model_args, target, extra, path)
                if "error" in planner:
                    results.append({"args": planner["args"], "error": planner["error"]})
                    prog.advance(task)
                    continue
                plan = str(path)
            case = run_case(model_args, plan, target, extra)
            if planner is not None:
                case["planner"] = {"wall_s": planner["wall_s"], "args": planner["args"]}
            case["predicted"] = predicted(model_args, plan, target, extra)
            case["exposure_agreement"] = _exposure_agreement(case)
            case["prediction_error"] = _errors(case)
            results.append(case)
            prog.advance(task)

    doc = _common.envelope("tierax.compile_grid/1") | {
        "note": "deviceless XLA:GPU compiles (compile-only devices, no autotuning, cuBLAS GEMMs); "
        "per-device figures",
        "cases": results,
    }
    out = _common.write_record(args.out, doc)

    t = Table(title=f"deviceless compile grid · jax {doc['jax_version']} · per device")
    for col in (
        "model",
        "plan",
        "target",
        "B/dev×seq",
        "dev",
        "preset",
        "peak GiB",
        "cap GiB",
        "fits",
        "temp GiB",
        "host GiB",
        "cuDNN calls",
        "pred GiB",
        "peak err",
        "xfer ms",
        "exposed ms",
        "model exposed ms",
        "Δ/step",
        "compile s",
    ):
        t.add_column(
            col, justify="left" if col in ("model", "plan", "target", "preset") else "right"
        )
    for c in results:
        if "error" in c:
            t.add_row(" ".join(c["args"][:4]), "[red]error[/]", c["error"][:60])
            continue
        r = c["result"]
        ov = r["overlap"]
        t.add_row(
            r["model"],
            r["plan"],
            r["target"],
            f"{r['microbatch']}×{r['seq']}",
            str(r["devices"]),
            r["xla_preset"],
            gib(r["device_peak_bytes"]),
            gib(r["device_capacity_bytes"]),
            "yes" if r["fits"] else "[red]no[/]",
            gib(r["device_temp_bytes"]),
            gib(r["host_temp_bytes"]),
            str(r.get("cudnn_calls", "")),
            *(
                (gib(c["predicted"]["peak_device_bytes"]), f"{er['peak']:+.1%}")
                if (er := c.get("prediction_error"))
                else ("", "")
            ),
            f"{ov['est_transfer_s'] * 1e3:.2f}",
            f"{ov['est_exposed_s'] * 1e3:.2f}",
            *(
                (f"{ag['model_exposed_s'] * 1e3:.2f}", f"{ag['difference_share_of_step']:.1%}")
                if (ag := c.get("exposure_agreement"))
                else ("", "")
            ),
            f"{r['compile_time_s']:.1f}",
        )
    Console(width=200).print(t)
    print(f"wrote {out}")
    return 1 if any("error" in c for c in results) else 0


if __name__ == "__main__":
    sys.exit(main())
