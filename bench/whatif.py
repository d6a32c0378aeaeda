#!/usr/bin/env python3
"""DeepSeek-V3 671B on the next machine: GB200 vs GB300 vs Vera Rubin, and the host-link sweep.

For each target (128 GPUs, mesh fsdp=16,expert=8, microbatch 8, seq 4096, schedule lhs) the
planner's best plan, its predicted TFLOP/s/device, step time and host bytes; then, on GB200, the
plan at every host-link rate from 100 to 1000 GB/s per direction, drawn as a PNG.  Cost-model
predictions: GB300 and VR200 are projections from announced figures (tierax.hardware), nothing here
was compiled or measured.

    .venv/bin/python bench/whatif.py  # → bench/results/whatif-deepseek-v3.json and .png
    .venv/bin/python bench/whatif.py --docs bench/results/whatif-deepseek-v3.json  # docs tables
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import _common

from tierax import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGETS = ("gb200", "gb300", "vr200")
MESH = "fsdp=16,expert=8"


DOCS_MARKER = "whatif-deepseek-v3"
GIB = 2**30


def markdown(doc: dict) -> str:
    """The docs tables of the record: the planner's plan per target, then the host-link sweep
    (every figure read from the record)."""
    lines = [
        "| target | figures | step s | TFLOP/s/device | device peak GiB | host GiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key, t in doc["targets"].items():
        figures = "projection" if t["projection"] else "shipping part"
        if not t["fits"]:
            lines.append(f"| {key} | {figures} | no plan fits | | | |")
            continue
        p = t["predicted"]
        lines.append(
            f"| {key} | {figures} | {p['step_time_s']:.3f} | {p['tflops_per_device']:.0f} | "
            f"{p['peak_device_bytes'] / GIB:.1f} | {p['host_bytes'] / GIB:.1f} |"
        )
    sw = doc["sweep"]
    refs = sorted({r for p in sw["points"] for r in p.get("reference", {})})
    lines += [
        "",
        f"| {sw['key']} (GB/s, {sw['target']}) | planner TFLOP/s/device | step s | "
        + " | ".join(f"{r} TFLOP/s/device" for r in refs)
        + " | names that moved |",
        "|---:|---:|---:|" + "---:|" * len(refs) + "---:|",
    ]
    for p in sw["points"]:
        ref = [p["reference"].get(r) for r in refs]
        if not p["fits"]:
            lines.append(f"| {p['value']:g} | no plan fits | |" + " |" * len(refs) + " |")
            continue
        lines.append(
            f"| {p['value']:g} | {p['tflops_per_device']:.0f} | {p['step_time_s']:.3f} | "
            + " | ".join("does not fit" if v is None else f"{v:.0f}" for v in ref)
            + f" | {len(p['changed'])} |"
        )
    lines += ["", f"{_common.made_by(doc, jax=False)}; cost-model predictions."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_docs(ap, "tierax.whatif/1", nothing="planned")
    ap.add_argument("--model", default="deepseek-v3-671b")
    ap.add_argument("--microbatch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--sweep", default="host_link=100:1000:100")
    _common.add_out(ap, "whatif-deepseek-v3.json")
    args = ap.parse_args(argv)
    if args.docs:
        return _common.docs_written(DOCS_MARKER, markdown(args.docs))
    out = args.out
    launch.start()

    from tierax import costmodel as cm
    from tierax import hardware, records
    from tierax.mesh import parse_mesh
    from tierax.models import for_platform, get_config
    from tierax.report.sweep_plot import plot_sweep
    from tierax.solving import planner, whatif
    from tierax.tracing import inventory as inv_lib
    from tierax.tracing.model_program import for_inventory

    cfg = for_platform(get_config(args.model), "gpu")  # every target swept is a GPU
    mesh = parse_mesh(MESH, 128)
    inv = inv_lib.model_inventory(cfg, args.microbatch, args.seq, mesh.to_dict())
    targets = {}
    for key in TARGETS:
        rates = cm.target_rates(key, cfg.dtype)
        spec = hardware.get_target(key)
        entry = {
            "projection": spec.projection or None,
            "rates": rates.sources,
            "device_memory_bytes": rates.device_memory_bytes,
            "host_link_bytes_per_s": rates.d2h_bytes_per_s,
        }
        try:
            res = planner.plan(for_inventory(cfg, inv), rates, schedule="lhs")
            entry |= {
                "fits": True,
                "predicted": {k: v for k, v in res.predicted.to_json().items() if k != "breakdown"},
                "placements": {f"{e.group}/{e.name}": e.choice for e in res.explain},
            }
        except planner.NoPlanFits as e:
            entry |= {"fits": False, "why": str(e)}
        targets[key] = entry
        print(
            key,
            "fits" if entry["fits"] else "no plan fits",
            f"{entry['predicted']['tflops_per_device']:.0f} TFLOP/s/device"
            if entry["fits"]
            else "",
            flush=True,
        )

    key, points = whatif.parse_sweep(args.sweep)
    rates = cm.target_rates("gb200", cfg.dtype)
    solve = whatif.plan_solver(
        cfg,
        mesh.to_dict(),
        args.seq,
        args.microbatch,
        rates,
        schedule="lhs",
        budget_bytes=None,
        host_budget_bytes=None,
    )
    pts = [
        p.to_json() for p in whatif.sweep(key, points, solve=solve, references=whatif.REFERENCES)
    ]
    title = (
        f"{cfg.name} · gb200 · 128 GPUs, mesh {MESH} · microbatch {args.microbatch}/device × seq "
        f"{args.seq} · lhs · sweep {key}"
    )
    png = out.with_suffix(".png")
    plot_sweep(pts, key, png, title=title, references=whatif.REFERENCES)
    doc = _common.envelope(records.WHATIF_SCHEMA, argv) | {
        "note": "cost-model predictions; gb300 and vr200 are projections from announced figures",
        "model": cfg.name,
        "mesh": mesh.to_dict(),
        "devices": 128,
        "microbatch": args.microbatch,
        "seq": args.seq,
        "schedule": "lhs",
        "targets": targets,
        "sweep": {
            "target": "gb200",
            "key": key,
            "points": pts,
            "png": str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png),
        },
    }
    _common.write_record(out, doc)
    print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
