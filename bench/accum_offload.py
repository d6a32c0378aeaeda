#!/usr/bin/env python3
"""The gradient accumulator in host memory, compiled deviceless at full size and set beside the
cost model.

Llama 3 8B on eight H200 (fsdp=8, 1 × 4096 per device per microbatch):

* ``minimal`` with two microbatches per update, the decoder's float32 accumulator on the device
  and offloaded (``state: {decoder: {grad_accum: offload}}``): XLA's host temp, device peak and
  host↔device copy bytes against the model's accumulator bytes (``P·4``), host bytes
  (``2·P·4`` while it is added to), the fall of the device peak and ``(A + 1)·P·4`` bytes each way;
* the planner's plan for four microbatches per update at a 15 GiB device budget, where it offloads
  the accumulator with the moments (``tierax plan ... --grad-accum 4 --budget-gib 15``), compiled:
  whether XLA's program fits the budget the plan was made for, and its host bytes against the
  model's.

    .venv/bin/python bench/accum_offload.py   # → bench/results/accum_offload.json
"""

from __future__ import annotations

import dataclasses
import time

import _common

MODEL, TARGET, MESH, DEVICES, MICROBATCH, SEQ = "llama3-8b", "h200", "fsdp=8", 8, 1, 4096
PLANNED_BUDGET_GIB, PLANNED_ACCUM = 15, 4
GIB = 2**30


def _pct(got: float, want: float) -> float | None:
    return None if not want else 100.0 * (got - want) / want


def _row(res, accum: int, wall: float) -> dict:
    d = res.to_json()
    by = d["overlap"]["by_direction"]
    return {
        "grad_accum": accum,
        "fits": d["fits"],
        "device_peak_bytes": d["device_peak_bytes"],
        "device_temp_bytes": d["device_temp_bytes"],
        "host_temp_bytes": d["host_temp_bytes"],
        "host_argument_bytes": d["host_argument_bytes"],
        "d2h_bytes": by["d2h"]["transfer_bytes"],
        "h2d_bytes": by["h2d"]["transfer_bytes"],
        "predicted": d["predicted"],
        "notes": d["notes"],
        "compile_wall_s": wall,
    }


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "accum_offload.json")
    args = ap.parse_args(argv)
    from tierax import launch

    launch.start(deviceless_gpu=True)
    from tierax import costmodel as cm
    from tierax.costmodel import state as state_cm
    from tierax.mesh import parse_mesh
    from tierax.models import for_platform, get_config
    from tierax.plan import preset
    from tierax.solving import planner
    from tierax.tracing import inventory as inv_lib
    from tierax.tracing.model_program import for_inventory
    from tierax.xla import compile as C

    cfg = for_platform(get_config(MODEL), "gpu")
    shape = parse_mesh(MESH, DEVICES)
    inv = inv_lib.model_inventory(cfg, MICROBATCH, SEQ, shape.to_dict())
    rates = cm.target_rates(TARGET, cfg.dtype)
    base = preset("minimal", cfg)
    on_host = dataclasses.replace(
        base, name="minimal, accumulator offloaded", state={"decoder": {"grad_accum": "offload"}}
    )
    doc = _common.envelope("tierax.bench.accum_offload/1", argv)
    doc |= {"model": MODEL, "target": TARGET, "mesh": shape.to_dict(), "microbatch": MICROBATCH}
    doc["seq"] = SEQ
    # The decoder's float32 accumulator per device, as the model counts it (its own terms).
    items, _ = state_cm.state_terms(inv, cfg, rates, 2)
    acc = next(i for i in items if i.group == "decoder" and i.kind == "grad_accum").host_bytes
    doc["decoder_accumulator_bytes"] = acc
    rows = {}
    for name, plan in (("device", base), ("offloaded", on_host)):
        t0 = time.perf_counter()
        res, _ = C.compile_for_target(
            cfg, plan, TARGET, microbatch=MICROBATCH, seq=SEQ, mesh=shape, grad_accum=2
        )
        rows[name] = _row(res, 2, time.perf_counter() - t0)
        print(
            name, {k: rows[name][k] for k in ("device_peak_bytes", "host_temp_bytes")}, flush=True
        )
    dev, off = rows["device"], rows["offloaded"]
    doc["minimal"] = rows
    doc["minimal_vs_model"] = {
        "host_temp_vs_model_host_pct": _pct(off["host_temp_bytes"], off["predicted"]["host_bytes"]),
        "device_peak_fall_bytes": dev["device_peak_bytes"] - off["device_peak_bytes"],
        "predicted_peak_fall_bytes": dev["predicted"]["peak_device_bytes"]
        - off["predicted"]["peak_device_bytes"],
        "h2d_vs_model_pct": _pct(off["h2d_bytes"] - dev["h2d_bytes"], 3 * acc),
        "d2h_vs_model_pct": _pct(off["d2h_bytes"] - dev["d2h_bytes"], 3 * acc),
        "device_peak_vs_model_pct": {
            k: _pct(r["device_peak_bytes"], r["predicted"]["peak_device_bytes"])
            for k, r in rows.items()
        },
    }
    t0 = time.perf_counter()
    planned = planner.plan(
        for_inventory(cfg, inv),
        rates,
        budget_bytes=PLANNED_BUDGET_GIB * GIB,
        grad_accum=PLANNED_ACCUM,
    )
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res, _ = C.compile_for_target(
        cfg,
        planned.plan,
        TARGET,
        microbatch=MICROBATCH,
        seq=SEQ,
        mesh=shape,
        grad_accum=PLANNED_ACCUM,
    )
    got = _row(res, PLANNED_ACCUM, time.perf_counter() - t0)
    got |= {
        "budget_bytes": PLANNED_BUDGET_GIB * GIB,
        "plan": planned.plan.to_dict(),
        "plan_wall_s": plan_s,
        "planned_step_s": planned.predicted.step_time_s,
        "state_explained": [e.to_json() for e in planned.explain if e.name.startswith("state:")],
        "within_budget": got["device_peak_bytes"] <= PLANNED_BUDGET_GIB * GIB,
        "device_peak_vs_model_pct": _pct(
            got["device_peak_bytes"], got["predicted"]["peak_device_bytes"]
        ),
        "host_vs_model_pct": _pct(
            got["host_argument_bytes"] + got["host_temp_bytes"], got["predicted"]["host_bytes"]
        ),
    }
    doc["planned"] = got
    print("planned", {k: got[k] for k in ("device_peak_bytes", "within_budget")}, flush=True)
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
