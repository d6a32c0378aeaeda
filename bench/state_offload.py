#!/usr/bin/env python3
"""Training state on the host, planned jointly with the activations: predicted and compiled.

Cases: Llama 3 8B on one H200 (4 × 8192), where no activations-only plan fits (parameters,
gradients and AdamW state alone are most of the HBM); the seed's DeepSeek-V3 671B on 128 GB200
(fsdp=16,expert=8; 8 × 4096 per device, cuDNN attention, 16 loss tiles as bench/seed_case.py).
For each: the joint plan (activations and state in one MILP) beside the activations-only plan
(``place_state=False``), predicted step time, peak and host bytes.  With ``--compile`` the Llama
case's joint plan is compiled deviceless for the H200, and so is the same activation plan with the
state on device, to set XLA's device peak, host arguments and host temp beside the plan's
(DeepSeek-V3's 128-device compile is not run here: ``--compile-deepseek`` adds it).

    .venv/bin/python bench/state_offload.py --compile   # → bench/results/state_offload.json
    .venv/bin/python bench/state_offload.py --docs bench/results/state_offload.json  # docs table
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import _common

CASES = (
    ("llama3-8b h200 4x8192", "llama3-8b", "h200", 4, 8192, "data=1", {}),
    (
        "deepseek-v3 gb200 8x4096",
        "deepseek-v3-671b",
        "gb200",
        8,
        4096,
        "fsdp=16,expert=8",
        {"attention": "cudnn", "loss_tiles": 16},
    ),
)


def _pred(p) -> dict:
    b = p.breakdown
    keys = (
        "state_bytes",
        "state_device_bytes",
        "state_host_bytes",
        "state_h2d_bytes",
        "state_d2h_bytes",
        "state_exposed_s",
        "state_update_device_s",
        "state_update_host_s",
        "recompute_s",
        "exposed_d2h_s",
        "exposed_h2d_s",
        "peak_phase",
    )
    return {
        "fits": p.fits,
        "peak_device_bytes": p.peak_device_bytes,
        "host_bytes": p.host_bytes,
        "step_time_s": p.step_time_s,
        "tflops_per_device": p.tflops_per_device,
    } | {k: b.get(k) for k in keys}


GIB = 2**30
DOCS_MARKER = "state-offload"


def _offloaded_state(plan: dict) -> str:
    state = plan.get("state") or {}
    off = [f"{g}.{k}" for g, sp in state.items() for k, v in sp.items() if v == "offload"]
    return ", ".join(f"`{o}`" for o in off) or "none"


def markdown(doc: dict) -> str:
    """The docs table of the record: per case, the joint plan beside the activations-only plan,
    predicted, and XLA's compile where the record holds one (every figure read from it)."""
    lines = [
        "| case | plan | state offloaded | predicted: fits, peak GiB | predicted step s "
        "(state copies exposed) | XLA: fits, peak GiB | XLA host arguments / temp GiB |",
        "|---|---|---|---|---:|---|---|",
    ]
    for r in doc["rows"]:
        mesh = ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "one device"
        case = f"{r['case']} (mesh {mesh})"
        compiled = r.get("compiled", {})
        entries = [("joint", r["joint"], compiled.get("joint"))]
        entries.append(("activations only", r["activations_only"], None))
        if "joint activations, state on device" in compiled:
            entries.append(
                (
                    "joint activations, state on device",
                    None,
                    compiled["joint activations, state on device"],
                )
            )
        for name, planned, comp in entries:
            if planned is not None and "error" in planned:
                pred = f"no plan fits: {planned['error'].split(':')[1].split('(')[0].strip()}"
                state, step = "—", "—"
            elif planned is not None:
                p = planned["predicted"]
                pred = f"{'yes' if p['fits'] else 'no'}, {p['peak_device_bytes'] / GIB:.2f}"
                state = _offloaded_state(planned["plan"])
                exposed = p.get("state_exposed_s") or 0.0
                step = f"{p['step_time_s']:.3f} ({exposed:.3f})"
            else:
                pred, state, step = "—", "none", "—"
            xla = host = "not compiled"
            if comp is not None:
                xla = f"{'yes' if comp['fits'] else 'no'}, {comp['device_peak_bytes'] / GIB:.2f}"
                host = (
                    f"{comp['host_argument_bytes'] / GIB:.2f} / {comp['host_temp_bytes'] / GIB:.2f}"
                )
            lines.append(f"| {case} | {name} | {state} | {pred} | {step} | {xla} | {host} |")
    lines += [
        "",
        f"`{doc['command']}`, {doc['created'][:10]}, jax {doc['jax_version']}; the plans are the "
        "planner's at that date.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_out(ap, "state_offload.json")
    ap.add_argument(
        "--docs",
        metavar="RECORD.json",
        type=_common.docs_record("tierax.bench.state_offload/1"),
        help="rewrite the docs table from this record and exit (nothing is planned or compiled)",
    )
    ap.add_argument("--compile", action="store_true", help="compile the Llama case deviceless")
    ap.add_argument(
        "--compile-deepseek", action="store_true", help="also compile the DeepSeek-V3 case"
    )
    args = ap.parse_args(argv)
    if args.docs:
        doc = args.docs
        print(f"wrote {_common.write_docs_table(DOCS_MARKER, markdown(doc))}")
        return 0
    from tierax import launch

    launch.start(deviceless_gpu=True)

    from tierax import costmodel as cm
    from tierax.errors import TieraxError
    from tierax.mesh import parse_mesh
    from tierax.models import for_platform, get_config
    from tierax.solving import planner
    from tierax.tracing import inventory as inv_lib
    from tierax.xla import compile as C

    doc = _common.envelope("tierax.bench.state_offload/1", argv)
    rows = []
    for label, model, target, mb, seq, mesh_text, sets in CASES:
        cfg = for_platform(dataclasses.replace(get_config(model), **sets), "gpu")
        shape = parse_mesh(mesh_text, None if mesh_text == "data=1" else 128)
        mesh = shape.to_dict()
        inv = inv_lib.model_inventory(cfg, mb, seq, mesh)
        rates = cm.target_rates(target, cfg.dtype)
        row: dict = {"case": label, "model": model, "target": target, "mesh": mesh}
        row["microbatch"], row["seq"], row["attention"] = mb, seq, cfg.attention
        joint = planner.plan(cfg, inv, rates, name="joint")
        row["joint"] = {"plan": joint.plan.to_dict(), "predicted": _pred(joint.predicted)}
        try:
            acts = planner.plan(cfg, inv, rates, name="activations-only", place_state=False)
            row["activations_only"] = {
                "plan": acts.plan.to_dict(),
                "predicted": _pred(acts.predicted),
            }
        except TieraxError as e:
            row["activations_only"] = {"error": str(e)}
        compile_it = args.compile if model == "llama3-8b" else args.compile_deepseek
        if compile_it:
            row["compiled"] = {}
            for which, plan in (
                ("joint", joint.plan),
                ("joint activations, state on device", dataclasses.replace(joint.plan, state={})),
            ):
                t0 = time.perf_counter()
                res, _ = C.compile_for_target(
                    cfg, plan, target, microbatch=mb, seq=seq, mesh=shape
                )
                d = res.to_json()
                row["compiled"][which] = {
                    k: d[k]
                    for k in (
                        "fits",
                        "out_of_memory",
                        "device_peak_bytes",
                        "device_argument_bytes",
                        "device_temp_bytes",
                        "host_temp_bytes",
                        "host_argument_bytes",
                        "state_host_bytes",
                        "device_limit_bytes",
                        "predicted",
                        "notes",
                        "xla_error",
                    )
                } | {"wall_s": time.perf_counter() - t0}
        rows.append(row)
        print(label, "joint", _pred(joint.predicted), flush=True)
    doc["rows"] = rows
    _common.write_record(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
