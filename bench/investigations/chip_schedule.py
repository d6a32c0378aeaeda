#!/usr/bin/env python3
"""Where the chip's own compiler schedules a step's host copies: the train step of each case
compiled on the device JAX finds (on the v5e chip: its libtpu), every host store and load with the
work XLA put between its start and its done and a replay of that schedule at the cost model's rates
(tierax.xla.hlo.host_transfers), beside the compiled peak.  Nothing runs; the compiles run in
threads.

Question: on the v5e chip the planner's head-dim-64 plan waited on its host loads at a compiled
peak below the scheduler limit the cost model assumes, and the MLA + MoE deepseek-offload plan ran
~12 % slower than predicted: does the chip's compile overlap those copies?  Answered: the chip's
compile and a deviceless compile under the chip's libtpu (0.0.42.1, installed in a scratch Python
3.11 environment) hold the same schedule, copy for copy (the chip's schedule can be read here);
the head-dim-64 plan's loads get 4-5 kernels of a layer backward's 20 (libtpu 0.0.52: 5-6), so the
scheduler shortens prefetches below the limit the model uses; the deepseek-offload plan's loads
span the whole layer backward, so its waits on the chip (stores 71 ms, loads 57 ms a step,
bench/results/chip/profiles/mlamoe_deepseek_mb16_ops.json, against the model's 52 and 23) come from
copies slower than the measured link rate, not from the schedule.  Neither is priced yet.

--timeline joins a chip op profile (bench/investigations/chip_op_profile.py) with the chip's own
compile of the same plan: each host copy's start and done in chip milliseconds into its loop body,
the wait at its done, its bytes (logical, and as XLA's tiled layout holds them on the host) and the
rate it got from its start to its done.  Answered for the head-dim-64 plan: its two loads a layer
(q 64 MiB, held at 128 MiB on the host: its 64-wide minor dimension is padded to the 128-lane tile;
out 64 MiB) start 19-20 ms into a 41 ms body and the second waits 13 ms, so the pair moved at
about 9 GB/s from start to done: the loads both start late and move slower than the measured
link; the deepseek-offload plan's five loads (480 MiB a layer) start together and end in the
order they started, at about 17 GB/s together.  Not priced.
--deviceless --pressure compiles the head-dim-64 plan at microbatches 5-8: where its loads' windows
shrink as its peak nears XLA:TPU's scheduler limit.
Records: bench/results/chip/chip_schedule.json, bench/results/chip/copy_timeline.json,
  bench/results/chip_schedule_deviceless_libtpu_0.0.42.1.json,
  bench/results/chip_schedule_deviceless_libtpu_0.0.52.json,
  bench/results/chip/profiles/mlamoe_deepseek_mb16_ops.json
Docs: docs/concepts/mechanisms.md

    python bench/investigations/chip_schedule.py --out OUT.json            # on the chip
    python bench/investigations/chip_schedule.py --out OUT.json --tiny     # rehearsal, any machine
    python bench/investigations/chip_schedule.py --deviceless --out OUT.json   # v5e, no chip
    python bench/investigations/chip_schedule.py --timeline --out OUT.json   # the profiles joined
    python bench/investigations/chip_schedule.py --deviceless --pressure \
        --out bench/results/chip_schedule_pressure_libtpu_0.0.52.json      # v5e, no chip
"""

from __future__ import annotations

import gzip
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "investigations"))

import _common  # noqa: E402 — the record envelope
import tpu_check  # noqa: E402 — the chip check's cases
import tpu_copy_schedule  # noqa: E402 — the schedule reading

SCHEMA = "tierax.chip-schedule/1"
PLAN_DIR = ROOT / "bench" / "results" / "chip" / "plans"
# (case of the chip check, microbatch, plan: a preset or a plan file under PLAN_DIR)
CASES = (
    ("dense-hd64", 8, "planned_hd64_mb8.yaml"),
    ("dense-hd64", 8, "qkv-offload"),
    ("mla-moe", 16, "deepseek-offload"),
)
# --pressure: the planner's head-dim-64 plan at microbatches that raise its peak toward XLA:TPU's
# scheduler limit, compiled deviceless: where its backward loads' windows start to shrink.
PRESSURE = tuple(("dense-hd64", mb, "planned_hd64_mb8.yaml") for mb in (5, 6, 7, 8))
TINY_MB = 2


def _case(name: str):
    return next(c for c in (*tpu_check.CASES, *tpu_check.EXTRA_CASES) if c[0] == name)


def _plan(spec: str, cfg):
    from tierax.plan.presets import load_plan

    return load_plan(str(PLAN_DIR / spec) if spec.endswith(".yaml") else spec, cfg)


def _read(row: dict, text: str, peak: int | None, temp: int | None, host: int | None, rates):
    """A compiled case's row: its peak and the schedule of its host copies."""
    from tierax.xla import hlo

    replay = hlo.host_transfers(
        hlo.parse_module(text),
        peak_flops=rates.matmul_flops_per_s,
        hbm_bytes_per_s=rates.hbm_bytes_per_s,
        host_link_bps=rates.d2h_bytes_per_s,
    )
    return row | {
        "hlo_text": text,
        "device_peak_bytes": peak,
        "temp_bytes": temp,
        "host_temp_bytes": host,
        "copies": tpu_copy_schedule.host_copies(text),
        "replay": hlo.overlap_summary(replay),
        "replay_copies": [
            {
                "direction": t.direction,
                "computation": t.computation,
                "bytes": t.bytes,
                "work_between": t.work_between,
                "compute_between_s": t.est_compute_between_s,
                "transfer_s": t.est_transfer_s,
                "stall_s": t.est_stall_s,
            }
            for t in replay
        ],
    }


def compile_deviceless(cases) -> list[dict]:
    """Each case compiled for a v5e chip without one (tierax's deviceless compile, this machine's
    libtpu), one after another."""
    from tierax import launch

    launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
    from tierax.costmodel.rates import target_rates
    from tierax.models import apply_overrides, get_config
    from tierax.xla.compile import compile_for_target, libtpu_version

    rates = target_rates("v5e", "bfloat16")
    rows = []
    for name, mb, spec in cases:
        _, base, overrides, seq, _, _ = _case(name)
        named = [o.replace("attention=auto", "attention=splash") for o in overrides]
        cfg = apply_overrides(get_config(base), named)  # the kernel named: no device to ask
        row = {"case": name, "microbatch": mb, "seq": seq, "plan": spec}
        t0 = time.perf_counter()
        res, text = compile_for_target(cfg, _plan(spec, cfg), "v5e", microbatch=mb, seq=seq)
        d = res.to_json()
        row = _read(
            row,
            text,
            d.get("device_peak_bytes"),
            d.get("device_temp_bytes"),
            d.get("host_temp_bytes"),
            rates,
        )
        rows.append(row | {"compile_s": time.perf_counter() - t0, "libtpu": libtpu_version()})
        print(f"compiled {name} mb {mb} {spec}", flush=True)
    return rows


def compile_cases(cases, tiny: bool) -> list[dict]:
    import os
    from concurrent.futures import ThreadPoolExecutor

    import jax

    from tierax.costmodel.rates import target_rates
    from tierax.mesh import MeshShape
    from tierax.train import step as step_lib

    rates = target_rates("v5e", "bfloat16")
    mesh = MeshShape(fsdp=jax.device_count()).make()
    optimizer = step_lib.make_optimizer()

    def prepare(case):
        """The case's step and abstract arguments; its state built on the device and freed at
        once (one case's state at a time)."""
        name, mb, spec = case
        _, base, overrides, seq, _, _ = _case(name)
        cfg = tpu_check.config_for(name, base, overrides, tiny)
        seq, mb = (tpu_check.TINY["seq"], TINY_MB) if tiny else (seq, mb)
        plan = _plan(spec, cfg)
        graphdef, state = step_lib.init_state(cfg, optimizer, mesh=mesh, plan=plan)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        shardings = step_lib.shardings_of(state)
        jax.tree.map(lambda x: x.delete(), state)
        fn = step_lib.make_train_step(graphdef, cfg, plan, optimizer, shardings)
        tokens = jax.ShapeDtypeStruct((mb, seq + 1), "int32")
        return {"case": name, "microbatch": mb, "seq": seq, "plan": spec}, fn, abstract, tokens

    def one(prepared):
        row, fn, abstract, tokens = prepared
        t0 = time.perf_counter()
        try:
            compiled = fn.lower(abstract, tokens).compile()
        except Exception as e:  # noqa: BLE001 — one case's failure is that case's row
            return row | {"error": f"{type(e).__name__}: {str(e)[:600]}"}
        mem = compiled.memory_analysis()
        peak = (
            mem.argument_size_in_bytes
            + mem.output_size_in_bytes
            - mem.alias_size_in_bytes
            + mem.temp_size_in_bytes
        )
        host = getattr(mem, "host_temp_size_in_bytes", None)
        row = _read(row, compiled.as_text(), peak, mem.temp_size_in_bytes, host, rates)
        return row | {"compile_s": time.perf_counter() - t0}

    with ThreadPoolExecutor(max_workers=min(len(cases), os.cpu_count() or 1)) as pool:
        return list(pool.map(one, [prepare(c) for c in cases]))


# (chip op profile, the chip's compile of the same plan: a case of chip_schedule.json)
TIMELINES = (
    ("bench/results/chip/profiles/hd64_planned_ops.json", 0),
    ("bench/results/chip/profiles/mlamoe_deepseek_mb16_ops.json", 2),
)


def timeline(profile: str, case: int) -> dict:
    """Each host copy of the chip's compile of ``case`` (chip_schedule.json) placed on the chip's
    own clock: every instruction of its computation at the profile's time per execution (a done's
    time is its wait), the copy's start and done in milliseconds from the computation's start, its
    bytes and the rate it got from start to done."""
    import json

    from tierax.xla import hlo

    sched = json.loads((ROOT / "bench/results/chip/chip_schedule.json").read_text())["cases"][case]
    prof = json.loads((ROOT / profile).read_text())
    ops = {o["name"]: o for ln in prof["lines"] if ln["thread"] == "XLA Ops" for o in ln["ops"]}
    hlo_path = ROOT / "bench/results/chip/schedule" / pathlib.Path(sched["hlo_file"]).name
    module = hlo.parse_module(gzip.decompress(hlo_path.read_bytes()).decode())

    def ms(name: str) -> float:  # per execution
        o = ops.get(name)
        return o["ms_per_step"] / o["count"] if o and o["count"] else 0.0

    copies = []
    for cname, instrs in module.computations.items():
        pairs = hlo._pairs(module, instrs)
        if not pairs:
            continue
        at, t = {}, 0.0
        for ins in instrs:
            at[ins.name] = t
            t += ms(ins.name)
        for start, (done, direction, nbytes) in pairs.items():
            if start not in at:
                continue
            ins = module.by_name[start]
            host = next(a for a in ins.arrays if a.host)
            t0, t1 = at[start], at[done] + ms(done)
            if t1 < t0:  # done in the next trip
                t1 += t
            # hlo._pairs gives the bytes the link moves: the host buffer's tiles
            tiled = nbytes
            nbytes = round(tiled * host.nbytes / host.assigned_bytes) if host.assigned_bytes else 0
            copies.append(
                {
                    "computation": cname,
                    "direction": direction,
                    "value": hlo.op_name(ins).split("tierax_offload_")[-1].split("/")[0],
                    "bytes": nbytes,
                    "host_bytes_tiled": tiled,
                    "start_ms": t0,
                    "done_ms": t1,
                    "wait_ms": ms(done),
                    "body_ms": t,
                    "start_to_done_bytes_per_s": tiled / ((t1 - t0) / 1e3) if t1 > t0 else None,
                }
            )
    together = []  # a loop body's copies of one direction, from the first start to the last done
    for cname in dict.fromkeys(c["computation"] for c in copies):
        for d in ("d2h", "h2d"):
            cs = [c for c in copies if c["computation"] == cname and c["direction"] == d]
            if len(cs) < 2:
                continue
            t0, t1 = min(c["start_ms"] for c in cs), max(c["done_ms"] for c in cs)
            moved = sum(c["host_bytes_tiled"] for c in cs)
            together.append(
                {"computation": cname, "direction": d, "copies": len(cs), "bytes_tiled": moved,
                 "first_start_ms": t0, "last_done_ms": t1,
                 "waits_ms": sum(c["wait_ms"] for c in cs),
                 "bytes_per_s": moved / ((t1 - t0) / 1e3) if t1 > t0 else None}
            )  # fmt: skip
    return {"profile": profile, "case": sched["case"], "microbatch": sched["microbatch"],
            "plan": sched["plan"], "copies": copies, "together": together}  # fmt: skip


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip_schedule.json")
    ap.add_argument("--tiny", action="store_true", help="the cases' kinds at toy sizes")
    ap.add_argument(
        "--deviceless",
        action="store_true",
        help="compile for a v5e chip without one (this machine's libtpu) instead of the device",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="no compile: the chip's op profiles joined with its compiles (chip_schedule.json)",
    )
    ap.add_argument(
        "--pressure",
        action="store_true",
        help="with --deviceless: the head-dim-64 plan at microbatches 5-8 (PRESSURE), not CASES",
    )
    args = ap.parse_args(argv)
    if args.pressure and not args.deviceless:
        ap.error("--pressure compiles deviceless: add --deviceless")
    doc = _common.envelope(SCHEMA, argv)
    if args.timeline:
        doc["timelines"] = [timeline(p, c) for p, c in TIMELINES]
        for tl in doc["timelines"]:
            for c in tl["copies"]:
                rate = c["start_to_done_bytes_per_s"]
                print(
                    f"{tl['case']} {tl['plan']} {c['direction']} {c['value']:14} "
                    f"{c['host_bytes_tiled'] / 2**20:5.0f} MiB  start {c['start_ms']:6.2f} done "
                    f"{c['done_ms']:6.2f} of {c['body_ms']:.1f} ms, waited {c['wait_ms']:5.2f}; "
                    f"{rate / 1e9 if rate else float('nan'):5.1f} GB/s start to done"
                )
            for g in tl["together"]:
                print(
                    f"  together: {g['copies']} {g['direction']} copies, "
                    f"{g['bytes_tiled'] / 2**20:.0f} MiB from {g['first_start_ms']:.2f} to "
                    f"{g['last_done_ms']:.2f} ms: {g['bytes_per_s'] / 1e9:.1f} GB/s, waits "
                    f"{g['waits_ms']:.2f} ms"
                )
        return _common.finish(args.out, doc)
    import jax

    if args.deviceless:
        doc["platform"], doc["device_kind"] = "deviceless", "TPU v5 lite (deviceless)"
        doc["cases"] = compile_deviceless(PRESSURE if args.pressure else CASES)
        from tierax import hardware
        from tierax.costmodel.rates import SCHEDULER_MEMORY_FRACTION

        device_limit = hardware.fit_limit_bytes(hardware.get_target("v5e"))  # XLA:TPU's own
        limit = SCHEDULER_MEMORY_FRACTION * device_limit
        for c in doc["cases"]:  # the compiled peak as a share of XLA:TPU's scheduler limit
            c["peak_share_of_scheduler_limit"] = c["device_peak_bytes"] / limit
        doc["scheduler_limit_bytes"], doc["device_limit_bytes"] = limit, device_limit
    else:
        doc["platform"] = jax.devices()[0].platform
        doc["device_kind"] = jax.devices()[0].device_kind
        doc["cases"] = compile_cases(CASES, args.tiny)
    for i, c in enumerate(doc["cases"]):  # each optimized program beside the record, gzipped
        text = c.pop("hlo_text", None)
        if text is not None and args.out:
            path = pathlib.Path(args.out).with_suffix(f".{i}.hlo.gz")
            path.write_bytes(gzip.compress(text.encode()))
            c["hlo_file"] = path.name
    for c in doc["cases"]:
        if "error" in c:
            print(f"{c['case']} mb {c['microbatch']} {c['plan']}: {c['error'][:200]}")
            continue
        loads = [x for x in c["copies"] if x["direction"] == "h2d"]
        print(
            f"{c['case']} mb {c['microbatch']} {c['plan']}: peak "
            f"{c['device_peak_bytes'] / 2**30:.2f} GiB; loads' work between start and done: "
            f"{[x['matmuls_or_kernels_between'] for x in loads]} kernels, "
            f"{[x['instructions_between'] for x in loads]} instructions",
            flush=True,
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
