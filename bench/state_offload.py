#!/usr/bin/env python3
"""Training state on the host, planned jointly with the activations: predicted and compiled.

Cases: Llama 3 8B on one H200 (4 × 8192), where no activations-only plan fits (parameters,
gradients and AdamW state alone are most of the HBM); the seed's DeepSeek-V3 671B on 128 GB200
(fsdp=16,expert=8; 8 × 4096 per device, cuDNN attention, 16 loss tiles as bench/seed_case.py).
For each: the joint plan (activations and state in one MILP) beside the activations-only plan
(``place_state=False``), predicted step time, peak and host bytes, and the planner's explanation of
each state choice.  With ``--compile`` every case is compiled deviceless at its full size (all of
DeepSeek-V3's 61 layers at the per-device shapes of its 128-device mesh: one SPMD program, about
40 s and 1.2 GB of host RAM here), under each plan:

* ``joint`` and ``activations-only`` (when one fits);
* the joint plan's activations with its state placement flipped: with the state on device where
  the joint plan offloads it (Llama: the fall in XLA's device peak is the offloaded state), or with
  every group's moments offloaded where it keeps them (DeepSeek-V3: the prediction, and compile's
  host-capacity check, say why the planner kept them);
* where the joint plan keeps the state on device: every group's moments offloaded with the joint
  plan's offloaded activations recomputed instead (the moments alone on the host), so the streamed
  update is compiled at the case's scale too.

Each compiled row sets XLA's device peak, host arguments and host temp beside the model's
prediction for the same plan (``vs_model``: XLA's minus the model's, in % of the model's).

Master weights (``masters``, with ``--compile``): Llama 3 8B on eight H200 (fsdp=8, 1 × 4096 per
device) under the ``minimal`` preset, compiled with the decoder's ``master_weights`` offloaded,
on device, and offloaded with its moments: XLA's host arguments against the offloaded bytes the
cost model counts (``P·p``), and the fall in XLA's device peak against ``P·(p − c)``.

    .venv/bin/python bench/state_offload.py --compile   # → bench/results/state_offload.json
    .venv/bin/python bench/state_offload.py --docs bench/results/state_offload.json  # docs table
"""

from __future__ import annotations

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
    b = p.breakdown.to_json()  # the terms under their JSON keys
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
    """The docs table of the record: per case, the joint plan beside the activations-only plan and
    every other plan the record compiled, predicted and (where compiled) XLA's figures, every
    figure read from the record."""
    lines = [
        "| case | plan | state offloaded | predicted: fits, peak GiB, host GiB | predicted step s "
        "| XLA: fits, peak GiB | XLA host arguments / temp GiB |",
        "|---|---|---|---|---:|---|---|",
    ]
    for r in doc["rows"]:
        mesh = ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "one device"
        case = f"{r['case']} (mesh {mesh})"
        compiled = dict(r.get("compiled", {}))
        alternatives = {
            a["label"]: a for a in (r.get("flipped"), r.get("moments_host_recomputed")) if a
        }
        entries = [
            ("joint", r["joint"], compiled.pop("joint", None)),
            ("activations only", r["activations_only"], compiled.pop("activations-only", None)),
        ]
        for name, comp in compiled.items():
            planned = alternatives.get(name)
            entries.append((name, planned, comp))
        for name, planned, comp in entries:
            p, state = None, "—"
            if planned is not None and "error" in planned:
                pred = f"no plan fits: {planned['error'].split(':')[1].split('(')[0].strip()}"
            else:
                if planned is not None:
                    p, state = planned["predicted"], _offloaded_state(planned["plan"])
                elif comp is not None and "predicted" in comp:
                    p = comp["predicted"]
                pred = (
                    f"{'yes' if p['fits'] else 'no'}, {p['peak_device_bytes'] / GIB:.2f}, "
                    f"{p['host_bytes'] / GIB:.2f}"
                    if p
                    else "—"
                )
            step = f"{p['step_time_s']:.3f}" if p and "step_time_s" in p else "—"
            xla = host = "not compiled"
            if comp is not None and "refused" in comp:
                xla, host = "refused before compiling: host memory", "—"
            elif comp is not None:
                xla = f"{'yes' if comp['fits'] else 'no'}, {comp['device_peak_bytes'] / GIB:.2f}"
                host = (
                    f"{comp['host_argument_bytes'] / GIB:.2f} / {comp['host_temp_bytes'] / GIB:.2f}"
                )
            lines.append(f"| {case} | {name} | {state} | {pred} | {step} | {xla} | {host} |")
    lines += [
        "",
        f"{_common.made_by(doc)}; the plans are the planner's at that date.",
    ]
    if "masters" in doc:
        lines += ["", masters_markdown(doc["masters"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


COMPILED_KEYS = (
    "fits",
    "out_of_memory",
    "device_peak_bytes",
    "device_argument_bytes",
    "device_temp_bytes",
    "host_temp_bytes",
    "host_argument_bytes",
    "state_host_bytes",
    "device_limit_bytes",
    "offloaded_bytes_by_name",
    "predicted",
    "notes",
    "xla_error",
)


def _flipped(plan):
    """``plan``'s activations with its state placement flipped: on device where it offloads any,
    else every layer group's moments offloaded."""
    from tierax.plan import StatePlacement

    if plan.offloads_state:
        return dataclasses.replace(plan, name=f"{plan.name}, state on device", state={})
    state = {g: StatePlacement(moments="offload") for g in plan.groups}
    return dataclasses.replace(plan, name=f"{plan.name}, moments offloaded", state=state)


def _moments_host_recomputed(plan):
    """``plan`` with every group's moments offloaded and its offloaded activations recomputed
    instead (host memory for the moments alone), for a case whose joint plan keeps the state on
    device because the activations fill the host."""
    from tierax.plan import Plan

    d = plan.to_dict()
    d["plan"] = f"{plan.name}, moments offloaded, offloaded activations recomputed"
    d["groups"] = {
        g: {n: ("remat" if v == "offload" else v) for n, v in names.items()}
        for g, names in d["groups"].items()
    }
    d["state"] = {g: {"moments": "offload"} for g in d["groups"]}
    return Plan.from_dict(d)


def _flipped_label(plan) -> str:
    return "joint activations, " + (
        "state on device" if plan.offloads_state else "moments offloaded"
    )


def _pct(got: float, want: float) -> float | None:
    return None if not want else 100.0 * (got - want) / want


def _vs_model(got: dict) -> dict:
    """XLA's figures against the model's for the same plan, in % of the model's."""
    pred = got["predicted"]
    host = got["host_argument_bytes"] + got["host_temp_bytes"]
    return {
        "device_peak_pct": _pct(got["device_peak_bytes"], pred["peak_device_bytes"]),
        # The model's host bytes: the offloaded state plus the larger of the offloaded
        # activations and the state (tierax.costmodel.state.host_peak); XLA holds the state as
        # host arguments, the activations and the update's new state (sharing memory) as temp.
        "host_bytes_model": pred["host_bytes"],
        "host_bytes_xla_arguments_plus_temp": host,
        "host_total_pct": _pct(host, pred["host_bytes"]),
        "host_state_pct": _pct(got["host_argument_bytes"], pred["state_host_bytes"]),
        # XLA's host temp against the model's larger of the offloaded activations and state.
        "host_temp_pct": _pct(
            got["host_temp_bytes"], pred["host_bytes"] - pred["state_host_bytes"]
        ),
    }


MASTERS_CASE = ("llama3-8b h200 fsdp=8 1x4096", "llama3-8b", "h200", 1, 4096, "fsdp=8", 8)
MASTERS_PLANS = (
    ("masters on device", {}),
    ("masters offloaded", {"master_weights": "offload"}),
    ("masters and moments offloaded", {"master_weights": "offload", "moments": "offload"}),
    ("moments offloaded", {"moments": "offload"}),
)


def masters_rows(C, cfg_of) -> dict:
    """The master-weights compiles (module docstring): each plan's XLA figures and the model's
    offloaded bytes; the fall of the device peak from the plan with the masters on device."""
    from tierax.mesh import parse_mesh
    from tierax.models import get_config
    from tierax.plan import preset

    label, model, target, mb, seq, mesh_text, devices = MASTERS_CASE
    cfg = cfg_of(get_config(model))
    shape = parse_mesh(mesh_text, devices)
    base = preset("minimal", cfg)
    out: dict = {"case": label, "model": model, "target": target, "mesh": shape.to_dict()}
    out["microbatch"], out["seq"], out["plans"] = mb, seq, {}
    for name, kinds in MASTERS_PLANS:
        plan = dataclasses.replace(
            base, name=name, state={g: kinds for g in base.groups} if kinds else {}
        )
        t0 = time.perf_counter()
        res, _ = C.compile_for_target(cfg, plan, target, microbatch=mb, seq=seq, mesh=shape)
        d = res.to_json()
        got = {k: d[k] for k in COMPILED_KEYS}
        p = got["predicted"]
        got["state"] = {g: kinds for g in base.groups}
        got["host_args_vs_state_host_pct"] = _pct(
            got["host_argument_bytes"], p.get("state_host_bytes", 0)
        )
        got["wall_s"] = time.perf_counter() - t0
        out["plans"][name] = got
        print(label, name, got["host_argument_bytes"], got["device_peak_bytes"], flush=True)
    on_device = out["plans"]["masters on device"]
    for got in out["plans"].values():
        freed = on_device["predicted"]["peak_device_bytes"] - got["predicted"]["peak_device_bytes"]
        fall = on_device["device_peak_bytes"] - got["device_peak_bytes"]
        got["device_peak_fall_bytes"] = fall
        got["predicted_peak_fall_bytes"] = freed
        got["fall_vs_predicted_pct"] = _pct(fall, freed)
    return out


def masters_markdown(m: dict) -> str:
    """The master-weights table of the record (every figure read from it)."""
    lines = [
        f"Master weights, {m['case']} (`minimal` preset):",
        "",
        "| plan | XLA host arguments GiB | model's offloaded state GiB | XLA device peak GiB "
        "| peak fall GiB: XLA / model |",
        "|---|---:|---:|---:|---|",
    ]
    for name, g in m["plans"].items():
        lines.append(
            f"| {name} | {g['host_argument_bytes'] / GIB:.2f} "
            f"| {g['predicted'].get('state_host_bytes', 0) / GIB:.2f} "
            f"| {g['device_peak_bytes'] / GIB:.2f} "
            f"| {g['device_peak_fall_bytes'] / GIB:.2f} / "
            f"{g['predicted_peak_fall_bytes'] / GIB:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "state_offload.json")
    _common.add_docs(ap, "tierax.bench.state_offload/1", nothing="planned or compiled")
    ap.add_argument("--compile", action="store_true", help="compile every case deviceless")
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
    from tierax.tracing.model_program import for_inventory
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
        joint = planner.plan(for_inventory(cfg, inv), rates, name="joint")
        row["joint"] = {
            "plan": joint.plan.to_dict(),
            "predicted": _pred(joint.predicted),
            "state_explained": [e.to_json() for e in joint.explain if e.name.startswith("state:")],
        }
        plans = {"joint": joint.plan}
        try:
            acts = planner.plan(
                for_inventory(cfg, inv), rates, name="activations-only", place_state=False
            )
            row["activations_only"] = {
                "plan": acts.plan.to_dict(),
                "predicted": _pred(acts.predicted),
            }
            plans["activations-only"] = acts.plan
        except TieraxError as e:
            row["activations_only"] = {"error": str(e)}
        plans[_flipped_label(joint.plan)] = _flipped(joint.plan)
        row["flipped"] = {
            "label": _flipped_label(joint.plan),
            "plan": _flipped(joint.plan).to_dict(),
            "predicted": _pred(
                cm.simulate(_flipped(joint.plan), for_inventory(cfg, inv), rates, "lhs")
            ),
        }
        if not joint.plan.offloads_state:
            extra = _moments_host_recomputed(joint.plan)
            label_x = "moments offloaded, joint's offloaded activations recomputed"
            plans[label_x] = extra
            row["moments_host_recomputed"] = {
                "label": label_x,
                "plan": extra.to_dict(),
                "predicted": _pred(cm.simulate(extra, for_inventory(cfg, inv), rates, "lhs")),
            }
        if args.compile:
            row["compiled"] = {}
            for which, plan in plans.items():
                t0 = time.perf_counter()
                try:
                    res, _ = C.compile_for_target(
                        cfg, plan, target, microbatch=mb, seq=seq, mesh=shape
                    )
                except TieraxError as e:  # refused before XLA runs (host capacity)
                    row["compiled"][which] = {"refused": str(e)}
                    print(label, which, "refused:", e, flush=True)
                    continue
                d = res.to_json()
                got = {k: d[k] for k in COMPILED_KEYS}
                row["compiled"][which] = (
                    got | {"vs_model": _vs_model(got)} | {"wall_s": time.perf_counter() - t0}
                )
                print(label, which, row["compiled"][which]["vs_model"], flush=True)
        rows.append(row)
        print(label, "joint", _pred(joint.predicted), flush=True)
    doc["rows"] = rows
    if args.compile:
        doc["masters"] = masters_rows(C, lambda c: for_platform(c, "gpu"))
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
