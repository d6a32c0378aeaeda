#!/usr/bin/env python3
"""Bandwidth per mesh axis: the planner's plan and its predicted step with one interconnect figure
vs per axis.

"one figure" prices every collective at the target's NVLink rate (the cost model before
tierax.costmodel.network: the same Rates with no domain limit); "per axis" prices each collective
at its group's link — NVLink inside one domain, the scale-out NICs across domains — with this job's
devices spread evenly over the domains (128 GB200s: 64 per NVL72 rack), and once more filling each
domain in order (--rate gpus_per_domain=72: 72 + 56). Cost-model predictions only; nothing is
compiled or measured.

    .venv/bin/python bench/network_axes.py [--out FILE]  # → bench/results/network_axes.json
    .venv/bin/python bench/network_axes.py --docs bench/results/network_axes.json  # docs table
"""

from __future__ import annotations

import dataclasses
import sys
import time

import _common

from tierax import launch

CASES = (  # name, model, target, devices, mesh, microbatch, seq
    ("deepseek-v3 128×gb200", "deepseek-v3-671b", "gb200", 128, "fsdp=16,expert=8", 8, 4096),
    (
        "deepseek-v3 128×gb200 expert=16",
        "deepseek-v3-671b",
        "gb200",
        128,
        "fsdp=8,expert=16",
        8,
        4096,
    ),
    (
        "deepseek-v3 8×gb200 (inside one rack; does not fit)",
        "deepseek-v3-671b",
        "gb200",
        8,
        "expert=8",
        1,
        4096,
    ),
    ("llama3-8b 16×h100", "llama3-8b", "h100", 16, "fsdp=16", 1, 4096),
    ("llama3-8b 8×h100 (one node)", "llama3-8b", "h100", 8, "fsdp=8", 1, 4096),
)


DOCS_MARKER = "network-axes"


def markdown(doc: dict) -> str:
    """The docs table of the record: per case and variant, the plan's predicted step, its
    collectives and how much of them is exposed (every figure read from the record)."""
    lines = [
        "| case | mesh | collectives priced | step s | TFLOP/s/device | collectives s | exposed s "
        "| plan changed |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for c in doc["cases"]:
        mesh = ",".join(f"{a}={n}" for a, n in c["mesh"].items() if n > 1)
        for label, v in c["variants"].items():
            note = "" if v["plan"] == "planner" else f" ({v['plan']})"
            lines.append(
                f"| {c['name']}{note} | {mesh} | {label} | {v['step_time_s']:.3f} | "
                f"{v['tflops_per_device']:.0f} | {v['collective_s']:.3f} | "
                f"{v['exposed_collective_s']:.3f} | "
                f"{'yes' if v['plan_changed_vs_one_figure'] else 'no'} |"
            )
    lines += ["", f"{_common.made_by(doc, jax=False)}; cost-model predictions."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "network_axes.json")
    _common.add_docs(ap, "tierax.network_axes/1", nothing="planned")
    args = ap.parse_args(argv)
    if args.docs:
        return _common.docs_written(DOCS_MARKER, markdown(args.docs))
    out = args.out
    launch.start()
    from tierax import costmodel as cm
    from tierax import hardware
    from tierax import plan as plan_lib
    from tierax.mesh import parse_mesh
    from tierax.models import for_platform, get_config
    from tierax.solving import planner
    from tierax.solving.whatif import override_rates
    from tierax.tracing import inventory as inv_lib
    from tierax.tracing.model_program import for_inventory

    cases = []
    for name, model, target, devices, mesh_text, mb, seq in CASES:
        t0 = time.perf_counter()
        cfg = for_platform(get_config(model), hardware.platform(target))
        mesh = parse_mesh(mesh_text, devices)
        inv = inv_lib.model_inventory(cfg, mb, seq, mesh.to_dict())
        rates = cm.target_rates(target, cfg.dtype)
        variants = {
            "one figure": dataclasses.replace(rates, nvlink_domain_gpus=0),
            "per axis": rates,
            "per axis, domains filled in order": override_rates(
                rates, [f"gpus_per_domain={rates.nvlink_domain_gpus}"]
            ),
        }
        entry = {
            "name": name,
            "model": model,
            "target": target,
            "devices": devices,
            "mesh": mesh.to_dict(),
            "microbatch": mb,
            "seq": seq,
            "schedule": "lhs",
            "command": f"tierax plan --model {model} --target {target} --devices {devices} --mesh "
            f"{mesh_text} --microbatch {mb} --seq {seq}",
            "variants": {},
        }
        before = None
        for label, r in variants.items():
            try:
                res = planner.plan(for_inventory(cfg, inv), r, schedule="lhs")
                p, placements, how = (
                    res.predicted,
                    {f"{e.group}/{e.name}": e.choice for e in res.explain},
                    "planner",
                )
            except (
                planner.NoPlanFits
            ):  # nothing fits: the remat-full preset, to compare the collectives
                p = cm.simulate(
                    plan_lib.preset("remat-full", cfg), for_inventory(cfg, inv), r, "lhs"
                )
                placements, how = {}, "remat-full preset (no plan fits)"
            b = p.breakdown
            before = placements if before is None else before
            entry["variants"][label] = {
                "plan": how,
                "fits": p.fits,
                "step_time_s": p.step_time_s,
                "tflops_per_device": p.tflops_per_device,
                "compute_s": b.compute_s,
                "recompute_s": b.recompute_s,
                "collective_s": b.collective_s,
                "exposed_collective_s": b.exposed_collective_s,
                "network": b.network,
                "plan_changed_vs_one_figure": placements != before,
                "changed": sorted(k for k in placements if placements[k] != before.get(k)),
                "placements": placements,
            }
        entry["wall_s"] = round(time.perf_counter() - t0, 2)
        cases.append(entry)
        v = entry["variants"]
        print(
            f"{name}: step {v['one figure']['step_time_s']:.3f} s → "
            f"{v['per axis']['step_time_s']:.3f} s (collective "
            f"{v['one figure']['collective_s']:.3f} → {v['per axis']['collective_s']:.3f} s, "
            f"exposed {v['one figure']['exposed_collective_s']:.3f} → "
            f"{v['per axis']['exposed_collective_s']:.3f} s); plan changed: "
            f"{v['per axis']['plan_changed_vs_one_figure']}",
            flush=True,
        )
    doc = _common.envelope("tierax.network_axes/1", argv) | {
        "note": "cost-model predictions (tierax.costmodel.network); 'one figure' = every "
        "collective at NVLink, as before",
        "cases": cases,
    }
    return _common.finish(out, doc)


if __name__ == "__main__":
    sys.exit(main())
