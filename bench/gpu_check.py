#!/usr/bin/env python3
"""One prepared GPU check of tierax on one H200 (≤ 8 minutes), and its CPU rehearsal (--tiny).

On the GPU machine (Python 3.12, jax 0.11.2, no package registry), from the repository root:

    PYTHONPATH=src python3 bench/gpu_check.py          # → bench/results/gpu-check-gpu-<time>.json
    PYTHONPATH=src python3 bench/gpu_check.py --out $OUT/gpu-check.json  # the lent device machine
    PYTHONPATH=src python3 bench/gpu_check.py --tiny   # the same pipeline on CPU, tiny-llama

What it does, within ``--budget-s`` (default 450 s; every stage checks the clock and
records what it skipped):

1. First child process (XLA preset ``none``): measures the pinned-host ↔ device copy
   bandwidth each way (``jax.device_put`` to ``SingleDeviceSharding(dev,
   memory_kind="pinned_host")`` and back, median of repeats, data checked) and the
   bf16 matmul rate (8192³, random data, median); then picks the configuration:
   llama3-8b shapes with fewer layers (``dataclasses.replace``), bf16 compute, and a
   microbatch at which ``save-all`` does NOT fit — decided from the compiled memory
   analysis of the save-all train step on the device (abstract inputs, nothing
   allocated) against the allocator's ``bytes_limit``, before anything runs.
2. One child process per XLA preset (``none``, ``lhs-pipelined``, ``lhs``; XLA_FLAGS
   are read when the backend starts, hence processes): for ``qkv-offload`` (tierax's
   prefetching scan), ``qkv-offload@policy`` (XLA's offload policy), ``remat-full``,
   ``minimal``, the planner's plan (``tierax.solving.planner.plan`` if it exists and returns a
   Plan, checked at run time; else "planner: not available") and, if its split search
   chooses segments, the planner's segmented plan:
   compile, skip if the compiled peak exceeds the device's memory, run warm-up and
   timed steps (median), record TFLOP/s/device, the allocator's peak HBM for the plan,
   compiled host bytes, and, for plans that offload, a 2-step profile → exposed
   transfer time and achieved bandwidth.  The offload plans' gradients are verified
   against save-all (``tierax.measure.verify``, right after the first offload plan ran)
   at a microbatch where save-all fits.
3. In the first child, after the plans: cuDNN's fused attention (``attention: cudnn``) against
   tierax's blockwise attention on the same model, params and tokens — loss and gradients of the
   remat-full step within bf16 tolerance, and each one's forward+backward time
   (``attention_check``).
4. The time model against the clock: the first child also measures the rate of a layer's
   non-matmul work at the bytes the model counts (``--tiny``: ``tierax calibrate``'s CPU
   microbenchmarks), so every rate the model reads is calibrated in this run; each plan's
   record carries the model's predicted step time and its terms (``time_model``), and the
   file a per-preset summary with both rankings.  One GPU runs no collective: the model's
   collective terms are not checked.
5. Writes one JSON file (schema ``tierax.gpu-check/1``, readable by ``tierax report``)
   and prints a short table last.

Only APIs present in jax 0.10.2 and still present in 0.12 are used.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # `python3 bench/gpu_check.py` without PYTHONPATH=src works too
    sys.path.insert(0, str(SRC))

import _common  # noqa: E402 — it imports tierax, found through SRC

SCHEMA = "tierax.gpu-check/1"
# lhs-pipelined second: it moves offload copies across loop iterations, the riskiest for
# correctness.
XLA_PRESETS = ("none", "lhs-pipelined", "lhs")
# The offload plan first (the one whose transfers and gradients matter most if time runs out), then
# roughly ascending device memory, so that each plan's runtime peak is its own (see measure.memory).
# "NAME@policy": the preset with XLA's offload policy instead of tierax's prefetching scan (the
# default mechanism), so one run compares the two ways of moving the same tensors, each with its
# gradient check.
PLANS = ("qkv-offload", "qkv-offload@policy", "remat-full", "minimal")
SCHEDULE_FOR_PRESET = {
    "none": "lhs",
    "lhs": "lhs",
    "lhs-pipelined": "lhs-pipelined",
}  # XLA's LHS runs by default

# GPU configuration: at microbatch 10 the deviceless H200 compile puts save-all over the device's
# memory and the other plans under it (`tierax compile --model llama3-8b --set num_layers=8 --seq
# 4096 --target h200 --microbatch 10 --plan P` shows each).  The device decides from its own compile
# (decide()), doubling the microbatch while save-all still fits.
GPU = {
    "model": "llama3-8b",
    "num_layers": 8,
    "seq": 4096,
    "microbatch": 10,
    "steps": 3,
    "warmup": 1,
    "profile_steps": 2,
    "verify_microbatch": 1,
    "link_bytes": 1 << 30,
    "link_repeats": 10,
    "matmul_n": 8192,
    "matmul_repeats": 20,
    "mem_fraction": "0.95",
    "mem_bytes": 1 << 30,
    "calib_repeats": 9,
}
TINY = {
    "model": "tiny-llama",
    "num_layers": 4,
    "seq": 16,
    "microbatch": 2,
    "steps": 2,
    "warmup": 1,
    "profile_steps": 2,
    "verify_microbatch": 2,
    "link_bytes": 8 << 20,
    "link_repeats": 3,
    "matmul_n": 256,
    "matmul_repeats": 3,
    "calib_repeats": 1,
}
_PARTIAL: dict = {}  # the child's result so far
_T0 = time.perf_counter()
TINY_CAPACITY_FRACTION = (
    0.98  # tiny mode: a synthetic "device memory" just below save-all's compiled peak
)


# --- small helpers ---------------------------------------------------------------------------


def _now() -> float:
    return time.time()


def _left(deadline: float) -> float:
    return deadline - _now()


# Measurements (child) come from tierax.measure.harness: the same step timing, link bandwidth and
# matmul rate as `tierax bench` and `tierax calibrate`.


# --- configuration and fit decision (child) ----------------------------------------------------


def preset_plan(spec: str, cfg):
    """A preset plan; ``NAME@MECHANISM`` runs it with that offload mechanism (named
    ``NAME-MECHANISM``)."""
    from tierax import plan as plan_lib

    name, _, mechanism = spec.partition("@")
    plan = plan_lib.preset(name, cfg)
    if mechanism:
        plan = dataclasses.replace(plan, name=f"{name}-{mechanism}", mechanism=mechanism)
    return plan


def base_config(p: dict):
    from tierax import launch
    from tierax.models import get_config

    # attention: auto, as the local backend runs it (cuDNN's fused attention on the GPU).
    base = launch.local_attention(get_config(p["model"]), what="gpu_check")
    return dataclasses.replace(
        base,
        name=f"{base.name}-{p['num_layers']}L-bf16",
        num_layers=p["num_layers"],
        dtype="bfloat16",
    )


def compiled_peak(cfg, plan_name: str, microbatch: int, seq: int) -> tuple[int, dict]:
    """Compiled device peak (bytes) of the train step, from abstract inputs (nothing allocated)."""
    import jax
    import jax.numpy as jnp

    from tierax.measure import memory
    from tierax.mesh import make_mesh
    from tierax.sharding import rules as sh
    from tierax.train import step as step_lib
    from tierax.xla.compile import abstract_train_state

    mesh = make_mesh(1, 1, jax.devices()[:1])
    opt = step_lib.make_optimizer()
    graphdef, state = abstract_train_state(cfg, opt, mesh)
    tokens = jax.ShapeDtypeStruct(
        (microbatch, seq + 1), jnp.int32, sharding=sh.batch_sharding(mesh)
    )
    fn = step_lib.make_train_step(
        graphdef, cfg, preset_plan(plan_name, cfg), opt, jax.tree.map(lambda x: x.sharding, state)
    )
    cm = memory.compiled_memory(fn.lower(state, tokens).compile())
    return cm.peak, cm.to_json()


def decide(p: dict, tiny: bool, deadline: float) -> dict:
    """Model, microbatch and device capacity such that save-all does not fit (compiled analysis,
    before running)."""
    from tierax.measure import memory
    from tierax.models import config_to_dict

    cfg = base_config(p)
    mb, seq = p["microbatch"], p["seq"]
    tried = []
    if tiny:
        peak, detail = compiled_peak(cfg, "save-all", mb, seq)
        capacity = int(peak * TINY_CAPACITY_FRACTION)
        tried.append(
            {
                "microbatch": mb,
                "save_all_peak_bytes": peak,
                "fits": peak <= capacity,
                "compiled": detail,
            }
        )
        source = f"synthetic (tiny mode): {TINY_CAPACITY_FRACTION:.0%} of save-all's compiled peak"
    else:
        stats = memory.runtime_stats()
        if stats is None or stats[0].bytes_limit is None:
            raise RuntimeError(
                "the device reports no memory_stats()/bytes_limit: cannot decide what fits"
            )
        capacity = int(stats[0].bytes_limit)
        source = "allocator bytes_limit (memory_stats) of device 0"
        for _ in range(4):  # the expected case is one compile; double until save-all does not fit
            peak, detail = compiled_peak(cfg, "save-all", mb, seq)
            tried.append(
                {
                    "microbatch": mb,
                    "save_all_peak_bytes": peak,
                    "fits": peak <= capacity,
                    "compiled": detail,
                }
            )
            if peak > capacity or _left(deadline) < 200:
                break
            mb *= 2
    return {
        "model": config_to_dict(cfg),
        "microbatch": mb,
        "seq": seq,
        "capacity_bytes": capacity,
        "capacity_source": source,
        "save_all_fits": tried[-1]["fits"],
        "tried": tried,
    }


def planner_plan(
    cfg,
    microbatch: int,
    seq: int,
    capacity: int,
    schedule: str,
    measured: dict,
    segments: bool = False,
):
    """(Plan or None, status line): ``tierax.solving.planner.plan`` if importable and returning a
    Plan (``segments``:
    with the split search, named ``planner-segments-…``)."""
    try:
        import importlib

        planner = importlib.import_module("tierax.solving.planner")
    except Exception as e:  # noqa: BLE001 — any import failure means "not available"
        return None, f"planner: not available (import failed: {type(e).__name__}: {e})"
    fn = getattr(planner, "plan", None)
    if not callable(fn):
        return None, "planner: not available (tierax.solving.planner has no plan() function)"
    try:
        from tierax import costmodel
        from tierax.plan import Plan
        from tierax.tracing import inventory

        rates = costmodel.target_rates("h200", cfg.dtype)
        fields = {f.name for f in dataclasses.fields(rates)}
        rates = dataclasses.replace(
            rates,
            **{k: v for k, v in measured.items() if k in fields},
            device_memory_bytes=capacity,
        )
        import jax

        if (
            jax.default_backend() == "cpu" and "fixed_device_bytes" in fields
        ):  # --tiny: no cuBLAS workspace
            rates = dataclasses.replace(rates, fixed_device_bytes=0)
        inv = inventory.model_inventory(cfg, microbatch, seq, {"data": 1, "fsdp": 1})
        name = f"planner-{'segments-' if segments else ''}{schedule}"
        res = fn(
            cfg,
            inv,
            rates,
            schedule=schedule,
            name=name,
            **({"segments": True} if segments else {}),
        )
    except Exception as e:  # noqa: BLE001 — the planner is another engineer's moving part; record why
        return (
            None,
            f"planner: not available ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})",
        )
    plan = res if isinstance(res, Plan) else getattr(res, "plan", None)
    if not isinstance(plan, Plan):
        return None, f"planner: not available (plan() returned {type(res).__name__}, not a Plan)"
    return plan, f"planner: tierax.solving.planner.plan(schedule={schedule!r}) → {plan.name}"


# --- the time model against the clock (child) ---------------------------------------------
# Rates calibrated in this run (the GPU: the bf16 matmul rate and host link measured above,
# plus the rate of a layer's non-matmul work; --tiny: `tierax calibrate`'s CPU
# microbenchmarks), the model's predicted step time per plan next to the measured one.  One
# GPU exercises no collective: the model's FSDP, expert and tensor collective terms are not
# checked here.


def calibrate_here(p: dict, tiny: bool) -> dict:
    """What the time model reads that the matmul and link stages did not measure."""
    from tierax.measure import calibrate, harness

    if tiny:  # the CPU's own rates: GEMM mix per dtype, memory bandwidth, first-touch rate
        return {"cpu_entry": calibrate.measure(repeats=p["calib_repeats"])}
    mem = harness.stream_and_first_touch(p["mem_bytes"], repeats=p["calib_repeats"])
    nm = harness.nonmatmul_rate(harness.GPU_NONMATMUL_SHAPE, repeats=p["calib_repeats"])
    return {"memory_bytes_per_s": nm["bytes_per_s"], "nonmatmul": nm, "memory": mem}


def model_rates(cfg, capacity: int, matmul: dict, link: dict, calib: dict, tiny: bool):
    """The cost model's rates for this device, every measured one from this run."""
    import jax

    from tierax import costmodel, hardware
    from tierax.measure import calibrate

    if tiny:
        rates = costmodel.target_rates("cpu", cfg.dtype, calibration={"cpu": calib["cpu_entry"]})
        return dataclasses.replace(rates, device_memory_bytes=capacity)
    key = calibrate.target_key()
    key = key if key in hardware.GPU_TARGETS else "h200"
    here = f"measured in this run on {jax.devices()[0].device_kind}"
    rates = costmodel.target_rates(key, cfg.dtype)
    return dataclasses.replace(
        rates,
        matmul_flops_per_s=matmul["flops_per_s"],
        hbm_bytes_per_s=calib["memory_bytes_per_s"],
        d2h_bytes_per_s=link["d2h_bytes_per_s"],
        h2d_bytes_per_s=link["h2d_bytes_per_s"],
        device_memory_bytes=capacity,
        sources=rates.sources | {k: here for k in ("matmul", "hbm", "host_link")},
    )


def predict_step(cfg, plan, microbatch: int, seq: int, rates, schedule: str) -> dict:
    """The model's step time for ``plan`` and its terms (tierax.costmodel.simulate)."""
    from tierax import costmodel
    from tierax.tracing import inventory
    from tierax.tracing.model_program import for_inventory

    inv = inventory.model_inventory(cfg, microbatch, seq, {"data": 1, "fsdp": 1})
    pred = costmodel.simulate(plan, for_inventory(cfg, inv), rates, schedule)
    b = pred.breakdown.to_json()  # the terms under their JSON keys
    terms = (
        "compute_s",
        "hbm_s",
        "fused_attention_s",
        "recompute_s",
        "recompute_hbm_s",
        "exposed_d2h_s",
        "exposed_h2d_s",
        "first_touch_s",
        "transpose_s",
    )
    return {
        "step_time_s": pred.step_time_s,
        "schedule": schedule,
        "peak_device_bytes": pred.peak_device_bytes,
        "terms_s": {k: b.get(k, 0.0) for k in terms},
    }


def attach_prediction(
    rec: dict, cfg, plan, microbatch: int, seq: int, rates, schedule: str
) -> None:
    """The model's prediction next to a plan's measured record (an error is recorded)."""
    if not rec.get("step_time_s"):
        return
    try:
        rec["time_model"] = predict_step(cfg, plan, microbatch, seq, rates, schedule)
        rec["time_model"]["error"] = rec["time_model"]["step_time_s"] / rec["step_time_s"] - 1
    except Exception as e:  # noqa: BLE001 — the measurement stands without the model
        rec["time_model_error"] = f"{type(e).__name__}: {e}"[:500]


def time_model_summary(runs: list[dict]) -> dict:
    """Per preset: predicted vs measured step time per plan, and both rankings."""
    out = {
        "note": "one GPU: collectives (FSDP all-gathers and reduce-scatters, MoE all-to-alls, "
        "tensor-parallel all-reduces) are not exercised, so their terms are not checked",
        "presets": [],
    }
    for run in runs:
        rows = [
            {
                "plan": r["plan"],
                "predicted_s": r["time_model"]["step_time_s"],
                "measured_s": r["step_time_s"],
                "error": r["time_model"]["error"],
            }
            for r in run.get("records", [])
            if r.get("step_time_s") and r.get("time_model")
        ]
        out["presets"].append(
            {
                "xla_preset": run.get("xla_preset"),
                "rates": run.get("model_rates"),
                "plans": rows,
                "ranking_predicted": [
                    r["plan"] for r in sorted(rows, key=lambda r: r["predicted_s"])
                ],
                "ranking_measured": [
                    r["plan"] for r in sorted(rows, key=lambda r: r["measured_s"])
                ],
            }
        )
    return out


# --- running plans (child) -----------------------------------------------------------------------


def tiny_backend(jax) -> bool:
    return jax.default_backend() == "cpu"


def run_plan(
    cfg,
    plan,
    *,
    microbatch: int,
    seq: int,
    p: dict,
    capacity: int,
    init,
    opt,
    opt_init,
    peak_flops: float,
    trace_dir: pathlib.Path,
) -> dict:
    """Compile, check the fit, run, measure memory and (for offload plans) profile one plan."""
    import jax
    import jax.numpy as jnp

    from tierax import plan as plan_lib
    from tierax.measure import memory
    from tierax.measure import profile as profile_lib
    from tierax.measure import trace as trace_lib
    from tierax.models.flops import train_flops
    from tierax.train import step as step_lib

    rec: dict = {"plan": plan.name, "plan_spec": plan.to_dict()}
    offloads = any(
        pl is plan_lib.Placement.OFFLOAD
        for g in plan_lib.resolve(plan, cfg).values()
        for pl in g.values()
    )
    tokens = step_lib.synthetic_batch(cfg, microbatch, seq, seed=1)
    probe = memory.PeakProbe(jax.devices()[:1])
    graphdef, params = init()
    state = step_lib.TrainState(params, opt_init(params), jnp.zeros((), jnp.int32))
    t0 = time.perf_counter()
    compiled = step_lib.make_train_step(graphdef, cfg, plan, opt).lower(state, tokens).compile()
    rec["compile_time_s"] = time.perf_counter() - t0
    cm = memory.compiled_memory(compiled)
    rec |= {
        "compiled_temp_bytes": cm.temp,
        "peak_device_bytes_compiled": cm.peak,
        "host_bytes_compiled": cm.host_total,
        "fits_compiled": cm.peak <= capacity,
    }
    if cm.peak > capacity:
        rec["skipped"] = (
            f"does not fit: compiled peak {cm.peak / 2**20:,.1f} MiB > capacity "
            f"{capacity / 2**20:,.1f} MiB"
        )
        rec |= {"step_time_s": None, "tokens_per_s": None}
        return rec
    box = {"state": state}
    metrics = None
    for _ in range(p["warmup"]):
        box["state"], metrics = compiled(box["state"], tokens)
    jax.block_until_ready(box["state"])
    runtime = probe.finish()

    def one(_i=0):
        box["state"], m = compiled(box["state"], tokens)
        jax.block_until_ready(box["state"])
        box["metrics"] = m

    from tierax.measure.harness import median_time

    med, times = median_time(one, p["steps"])
    flops = train_flops(cfg, microbatch, seq)
    rec |= {
        "step_time_s": med,
        "step_times_s": times,
        "tokens_per_s": microbatch * seq / med,
        "tflops_per_device": flops / med / 1e12,
        "mfu": flops / med / peak_flops,
        "loss": float(box["metrics"]["loss"]),
        "peak_device_bytes_runtime": runtime.peak_bytes if runtime else None,
        "runtime_peak_exact": runtime.exact if runtime else None,
        "host_bytes_runtime": (runtime.host_stats or None) if runtime else None,
        "memory_source": memory.RUNTIME if runtime else memory.COMPILED,
    }
    if offloads:
        d = trace_dir / plan.name
        profile_lib.record(one, steps=p["profile_steps"], log_dir=d)
        analysis = trace_lib.analyze_trace(d)
        s = analysis.summary()
        rec |= {
            "exposed_transfer_s": s.get("exposed_transfer_s"),
            "transfer_s": s.get("transfer_s"),
            "overlap_s": s.get("overlap_s"),
            "compute_s": s.get("compute_s"),
            "h2d_bandwidth_bytes_per_s": s.get("h2d_bandwidth_bytes_per_s"),
            "d2h_bandwidth_bytes_per_s": s.get("d2h_bandwidth_bytes_per_s"),
            "transfers_observed": analysis.transfers_observed,
            "trace_notes": list(analysis.notes),
        }
        if not analysis.transfers_observed and cm.host_total and not tiny_backend(jax):
            # XLA may move offloaded data with kernels that access pinned host memory directly (no
            # Memcpy events): then the profile cannot time the transfers, and the record must not
            # claim it did.
            rec["trace_notes"].append(
                f"the plan offloads {cm.host_total} bytes (compiled) but the trace shows no "
                "Memcpy on any stream: exposed transfer time not measured"
            )
            rec["exposed_transfer_s"] = None
    else:
        rec["exposed_transfer_s"] = None  # offloads nothing: not profiled
    box = state = compiled = None  # drop the device buffers before the next plan
    gc.collect()
    return rec


def child(spec: dict) -> dict:
    """One XLA preset in this process."""
    from tierax.launch import flags as xla_flags

    tiny = spec["tiny"]
    env = (
        {}
        if tiny
        else {
            "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get(
                "XLA_PYTHON_CLIENT_MEM_FRACTION", GPU["mem_fraction"]
            )
        }
    )
    # "cuda" explicitly: a GPU check must fail, not quietly run on the CPU, if the GPU backend does
    # not start.
    xla_flags.configure(preset=spec["preset"], platforms="cpu" if tiny else "cuda", env=env)
    import jax

    from tierax import plan as plan_lib
    from tierax.errors import TieraxError
    from tierax.measure import verify as verify_lib
    from tierax.models import config_from_dict
    from tierax.train import step as step_lib

    p = TINY if tiny else GPU
    deadline = spec["deadline"]
    from tierax.measure import harness
    from tierax.records import machine_info

    out: dict = {
        "xla_preset": spec["preset"],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "machine": machine_info(),
        "jax_version": jax.__version__,
        "records": [],
        "notes": [],
    }
    _PARTIAL["out"] = out  # what a crash still reports
    out["phases_s"] = {"start": time.perf_counter() - _T0}

    @contextlib.contextmanager
    def phase(name):  # where the child's time went (the budget is tight on the GPU)
        t = time.perf_counter()
        try:
            yield
        finally:
            out["phases_s"][name] = time.perf_counter() - t

    if spec.get("decision") is None:
        with phase("link"):
            out["link"] = harness.link_bandwidth(p["link_bytes"], p["link_repeats"])
        with phase("matmul"):
            out["matmul"] = harness.matmul_rate(
                "bfloat16", p["matmul_n"], p["matmul_repeats"], best=False
            )
        with phase("decide"):
            out["decision"] = decide(p, tiny, deadline)
        with phase("calibrate"):
            out["calibration"] = calibrate_here(p, tiny)
    decision = spec.get("decision") or out["decision"]
    matmul = spec.get("matmul") or out["matmul"]
    link = spec.get("link") or out["link"]
    cfg = config_from_dict(decision["model"], source="gpu_check decision")
    mb, seq, capacity = decision["microbatch"], decision["seq"], decision["capacity_bytes"]
    calib = spec.get("calibration") or out["calibration"]
    rates = model_rates(cfg, capacity, matmul, link, calib, tiny)
    out["model_rates"] = rates.sources
    measured = {
        "matmul_flops_per_s": matmul["flops_per_s"],
        "hbm_bytes_per_s": rates.hbm_bytes_per_s,
        "d2h_bytes_per_s": link["d2h_bytes_per_s"],
        "h2d_bytes_per_s": link["h2d_bytes_per_s"],
    }
    plans = [preset_plan(n, cfg) for n in spec.get("plans", PLANS)]
    with phase("planner"):
        planned, status = planner_plan(
            cfg, mb, seq, capacity, SCHEDULE_FOR_PRESET[spec["preset"]], measured
        )
    out["planner"] = {"status": status, "plan": planned.to_dict() if planned else None}
    if planned is not None:
        plans.append(planned)
    with phase(
        "planner segments"
    ):  # the split search: run only if it chose segments (a different plan)
        seg, seg_status = planner_plan(
            cfg, mb, seq, capacity, SCHEDULE_FOR_PRESET[spec["preset"]], measured, segments=True
        )
    out["planner_segments"] = {"status": seg_status, "plan": seg.to_dict() if seg else None}
    if seg is not None and any(g.segments for g in seg.groups.values()):
        plans.append(seg)

    # One compiled init for every plan and the gradient check (step.init_params would recompile it
    # each time), one optimizer and its compiled init.
    graphdef, init_fn = verify_lib.model_and_init(cfg, 0)
    opt = step_lib.make_optimizer()
    opt_init = jax.jit(opt.init)

    def init():
        return graphdef, init_fn()

    def offloads(pl) -> bool:
        return any(
            x is plan_lib.Placement.OFFLOAD
            for g in plan_lib.resolve(pl, cfg).values()
            for x in g.values()
        )

    def verify(pls) -> None:
        """Gradients of offload plans vs save-all, at a microbatch where save-all fits."""
        if _left(deadline) < (20 if tiny else 120):
            out["notes"].append(
                f"gradient check of {', '.join(x.name for x in pls)} skipped: time budget"
            )
            return
        try:
            with phase("verify " + ",".join(x.name for x in pls)):
                results = verify_lib.verify_plans(
                    cfg, pls, microbatch=p["verify_microbatch"], seq=seq
                )
            out.setdefault("verify", []).extend(r.to_json() for r in results)
            for rec in out["records"]:
                match = next((r for r in results if r.plan == rec["plan"]), None)
                if match is not None:
                    rec["verified"] = match.passed
        except Exception as e:  # noqa: BLE001 — e.g. out of memory: recorded, the run goes on
            out.setdefault("verify_errors", []).append(f"{type(e).__name__}: {e}"[:2000])

    # The first offload plan is checked right after it ran (before time can run out); the other
    # offload plans (the planner's) at the end.
    first_offload = next((pl for pl in plans if offloads(pl)), None)
    per_plan = 30.0 if tiny else 90.0  # a first guess; then the slowest plan so far
    with tempfile.TemporaryDirectory(prefix="tierax-gpu-check-traces-") as tdir:
        for plan in plans:
            try:  # a mechanism not offered with this preset is recorded as refused, not run
                plan_lib.check_mechanism_preset(plan, spec["preset"], f"plan {plan.name}")
            except TieraxError as e:
                out["records"].append(
                    {
                        "plan": plan.name,
                        "refused": str(e),
                        "step_time_s": None,
                        "tokens_per_s": None,
                    }
                )
                continue
            if _left(deadline) < per_plan:
                out["records"].append(
                    {
                        "plan": plan.name,
                        "skipped": "time budget",
                        "step_time_s": None,
                        "tokens_per_s": None,
                    }
                )
                continue
            t0 = _now()
            try:
                out["records"].append(
                    run_plan(
                        cfg,
                        plan,
                        microbatch=mb,
                        seq=seq,
                        p=p,
                        capacity=capacity,
                        init=init,
                        opt=opt,
                        opt_init=opt_init,
                        peak_flops=matmul["flops_per_s"],
                        trace_dir=pathlib.Path(tdir),
                    )
                )
            except Exception as e:  # noqa: BLE001 — one failing plan (e.g. out of memory) must not lose the others
                out["records"].append(
                    {
                        "plan": plan.name,
                        "error": f"{type(e).__name__}: {e}"[:2000],
                        "step_time_s": None,
                        "tokens_per_s": None,
                    }
                )
                gc.collect()
            attach_prediction(
                out["records"][-1], cfg, plan, mb, seq, rates, SCHEDULE_FOR_PRESET[spec["preset"]]
            )
            per_plan = max(per_plan, _now() - t0)
            out["phases_s"][f"plan {plan.name}"] = _now() - t0
            if plan is first_offload:
                verify([plan])
    rest = [
        pl
        for pl in plans
        if offloads(pl)
        and pl is not first_offload
        and any(r["plan"] == pl.name and r.get("step_time_s") for r in out["records"])
    ]
    if rest:
        verify(rest)
    if (
        spec["preset"] == XLA_PRESETS[0]
    ):  # once: the attention kinds do not depend on the XLA preset
        with phase("attention"):
            try:
                out["attention"] = attention_check(cfg, p, tiny, seq, deadline)
            except Exception as e:  # noqa: BLE001 — recorded, the run goes on
                out["attention"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    return out


def attention_check(cfg, p: dict, tiny: bool, seq: int, deadline: float) -> dict:
    """cuDNN's fused attention against tierax's blockwise attention on the same model, params and
    tokens:
    loss and gradients of the remat-full step (bf16 tolerance) and its forward+backward time
    (median).

    On the CPU rehearsal cuDNN cannot run: ``cudnn_blockwise`` (the cuDNN route in XLA form) stands
    in, and the record says so.
    """
    import jax
    import numpy as np

    from tierax import plan as plan_lib
    from tierax.train import step as step_lib

    fused = "cudnn_blockwise" if tiny else "cudnn"
    out = {"fused": fused, "microbatch": p["verify_microbatch"], "seq": seq, "plan": "remat-full"}
    if _left(deadline) < (20 if tiny else 90):
        return out | {"skipped": "time budget"}
    grads, losses = {}, {}
    for impl in ("blockwise", fused):
        c = dataclasses.replace(cfg, attention=impl)
        graphdef, params = step_lib.init_params(c, seed=0)
        tokens = step_lib.synthetic_batch(c, p["verify_microbatch"], seq, seed=1)
        loss_fn = step_lib.make_loss_fn(
            graphdef, plan_lib.to_policies(plan_lib.preset("remat-full", c), c), None
        )
        f = jax.jit(jax.value_and_grad(loss_fn))
        t0 = time.perf_counter()
        loss, g = jax.block_until_ready(f(params, tokens))
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(p["steps"]):
            t0 = time.perf_counter()
            jax.block_until_ready(f(params, tokens))
            times.append(time.perf_counter() - t0)
        losses[impl], grads[impl] = float(loss), g
        out[impl] = {
            "loss": float(loss),
            "compile_s": compile_s,
            "step_s": sorted(times)[len(times) // 2],
            "steps": len(times),
        }
        del params
    worst = 0.0
    for a, b in zip(
        jax.tree.leaves(grads[fused]), jax.tree.leaves(grads["blockwise"]), strict=True
    ):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30)))
    tol = 2e-2  # bfloat16 (tierax verify's dtype-aware tolerance)
    out |= {
        "max_rel_grad_error": worst,
        "tolerance": tol,
        "passed": worst <= tol
        and abs(losses[fused] - losses["blockwise"]) <= tol * abs(losses["blockwise"]),
    }
    if not tiny:
        out["workspace"] = cudnn_workspace()
    return out


def cudnn_workspace() -> dict:
    """XLA's temp bytes for cuDNN attention's gradient compiled on the device (which sizes cuDNN's
    workspace,
    as a deviceless compile cannot) beside tierax.hardware.cudnn's shape formula: B=1, S=4096,
    H=16, q/k/v head dim 128 and q/k 192 with v padded to it (tierax's MLA route)."""
    import jax
    import jax.numpy as jnp

    from tierax.hardware import cudnn
    from tierax.models.attention import causal_attention

    rows = []
    for d, dv in ((128, 128), (192, 128)):
        q = jax.ShapeDtypeStruct((1, 4096, 16, 1, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((1, 4096, 16, d), jnp.bfloat16)
        v = jax.ShapeDtypeStruct((1, 4096, 16, dv), jnp.bfloat16)

        def loss(q, k, v):
            return causal_attention(q, k, v, impl="cudnn").astype(jnp.float32).sum()

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
        rows.append(
            {
                "d_qk": d,
                "d_v": dv,
                "xla_temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
                "workspace_formula_bytes": cudnn.backward_workspace_bytes(1, 16, 4096, d),
            }
        )
    return {
        "rows": rows,
        "note": "xla_temp_bytes holds the workspace and the gradient's other temporaries",
    }


# --- orchestration (parent: never starts a JAX backend, so each child gets the whole device) ------


def _run_child(spec: dict, timeout: float, tiny: bool) -> dict:
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        result_path = f.name
    spec = dict(spec, result_path=result_path)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            [str(SRC)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        ),
    )
    if tiny:
        env["JAX_PLATFORMS"] = "cpu"
    t0 = time.perf_counter()
    try:
        r = _common.run(
            [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", json.dumps(spec)],
            env=env,
            timeout=max(timeout, 1),
        )
        log = (r.stdout + r.stderr)[-4000:]
        text = pathlib.Path(result_path).read_text()
        if r.returncode != 0 or not text:
            return {
                "xla_preset": spec["preset"],
                "error": f"child exited {r.returncode}",
                "log_tail": log,
                "records": [],
            }
        out = json.loads(text)
        out["wall_s"] = time.perf_counter() - t0
        return out
    except subprocess.TimeoutExpired as e:
        return {
            "xla_preset": spec["preset"],
            "error": f"timed out after {timeout:.0f} s",
            "log_tail": str(e.stdout or "")[-2000:],
            "records": [],
        }
    finally:
        pathlib.Path(result_path).unlink(missing_ok=True)


def _fmt(x, scale=1.0, digits=1) -> str:
    return "—" if not isinstance(x, (int, float)) else f"{x / scale:.{digits}f}"


def table(doc: dict) -> str:
    link, mm = doc.get("link") or {}, doc.get("matmul") or {}
    unit, scale = ("GiB", 2**30) if (doc.get("capacity_bytes") or 0) >= 2**30 else ("MiB", 2**20)
    lines = [
        f"gpu-check ({doc['mode']}) · {doc.get('model', {}).get('name', '?')} · microbatch "
        f"{doc.get('microbatch_per_device')} × seq {doc.get('seq')} · capacity "
        f"{_fmt(doc.get('capacity_bytes'), scale)} {unit} · save-all fits: "
        f"{doc.get('save_all_fits')}",
        f"link (pinned host): H→D {_fmt(link.get('h2d_bytes_per_s'), 1e9)} GB/s, D→H "
        f"{_fmt(link.get('d2h_bytes_per_s'), 1e9)} GB/s · matmul "
        f"{_fmt(mm.get('flops_per_s'), 1e12, 3)} TFLOP/s · "
        f"{doc.get('planner', {}).get('status', '')}",
    ]
    head = (
        f"{'preset':14} {'plan':22} {'step ms':>9} {'model ms':>9} {'TFLOP/s':>8} "
        f"{'peak dev ' + unit:>13} {'host ' + unit:>9} {'exposed ms':>10} {'verified':>8}"
    )
    lines += [head, "-" * len(head)]
    for run in doc["runs"]:
        if run.get("error"):
            lines.append(
                f"{run['xla_preset']:14} ERROR: {run['error'].strip().splitlines()[-1][:120]}"
            )
        for r in run.get("records", []):
            peak = r.get("peak_device_bytes_runtime") or r.get("peak_device_bytes_compiled")
            status = r.get("skipped") or r.get("error")
            if status and r.get("step_time_s") is None:
                lines.append(f"{run['xla_preset']:14} {r['plan'][:22]:22} {status[:70]}")
                continue
            v = r.get("verified")
            model = (r.get("time_model") or {}).get("step_time_s")
            lines.append(
                f"{run['xla_preset']:14} {r['plan'][:22]:22} {_fmt(r.get('step_time_s'), 1e-3):>9} "
                f"{_fmt(model, 1e-3):>9} {_fmt(r.get('tflops_per_device'), 1, 3):>8} "
                f"{_fmt(peak, scale, 2):>13} "
                f"{_fmt(r.get('host_bytes_compiled'), scale, 2):>9} "
                f"{_fmt(r.get('exposed_transfer_s'), 1e-3, 2):>10} "
                f"{'—' if v is None else 'yes' if v else 'NO':>8}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tiny", action="store_true", help="the whole pipeline on CPU at tiny size (tiny-llama)"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="wall-clock budget for everything (default 450)",
    )
    ap.add_argument("--presets", default=",".join(XLA_PRESETS), help="XLA presets, comma-separated")
    ap.add_argument(
        "--plans",
        default=",".join(PLANS),
        help="preset plans to run besides the planner's (default: %(default)s)",
    )
    ap.add_argument(
        "--out",
        type=_common.out_path,
        metavar="FILE.json",
        help="the record to write (default: bench/results/gpu-check-<mode>-<UTC time>.json)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        try:
            result = child(spec)
        except Exception:  # noqa: BLE001 — report, don't lose, a child's failure
            result = _PARTIAL.get("out") or {"xla_preset": spec["preset"], "records": []}
            result["error"] = traceback.format_exc()[-3000:]
        pathlib.Path(spec["result_path"]).write_text(json.dumps(result))
        return 0

    presets = [x.strip() for x in args.presets.split(",") if x.strip()]
    unknown = [x for x in presets if x not in XLA_PRESETS]
    if unknown:
        print(
            f"gpu_check: unknown XLA preset(s) {unknown}; choose from {', '.join(XLA_PRESETS)}",
            file=sys.stderr,
        )
        return 2
    plans = [x.strip() for x in args.plans.split(",") if x.strip()]
    from tierax.plan import MECHANISMS
    from tierax.plan import PRESETS as PLAN_PRESETS

    def known(x: str) -> bool:
        name, _, mech = x.partition("@")
        return name in PLAN_PRESETS and (not mech or mech in MECHANISMS)

    if not plans or not all(known(x) for x in plans):
        print(
            f"gpu_check: --plans must name plan presets ({', '.join(PLAN_PRESETS)}), optionally "
            f"NAME@MECHANISM ({', '.join(MECHANISMS)})",
            file=sys.stderr,
        )
        return 2
    mode = "tiny" if args.tiny else "gpu"
    if not args.tiny and not any(
        os.path.exists(f) for f in ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0")
    ):
        print(
            "gpu_check: no NVIDIA driver on this machine; use --tiny for the CPU rehearsal",
            file=sys.stderr,
        )
        return 2
    start = _now()
    deadline = start + args.budget_s
    out = args.out or _common.RESULTS / (
        f"gpu-check-{mode}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    )
    runs, first = [], None
    for i, preset in enumerate(presets):
        left = _left(deadline)
        if left < (15 if args.tiny else 60):
            runs.append({"xla_preset": preset, "error": "skipped: time budget", "records": []})
            continue
        # Later children get an even share of the time left, the first one more (it measures and
        # decides).
        share = (
            left
            if i == len(presets) - 1
            else left * (0.5 if first is None else 1 / (len(presets) - i))
        )
        spec = {"tiny": args.tiny, "preset": preset, "plans": plans, "deadline": _now() + share - 5}
        if first is not None:
            spec |= {k: first.get(k) for k in ("decision", "link", "matmul", "calibration")}
        res = _run_child(spec, timeout=share + 20, tiny=args.tiny)
        if first is None and res.get("decision"):
            first = res
        runs.append(res)
    first = first or next((r for r in runs if r.get("machine")), {})
    decision = first.get("decision") or {}
    doc = {
        "schema": SCHEMA,
        "mode": mode,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": (first.get("machine") or {})
        | ({"device": first.get("device")} if first.get("device") else {}),
        "jax_version": first.get("jax_version"),
        "model": decision.get("model", {}),
        "microbatch_per_device": decision.get("microbatch"),
        "seq": decision.get("seq"),
        "steps": (TINY if args.tiny else GPU)["steps"],
        "capacity_bytes": decision.get("capacity_bytes"),
        "capacity_source": decision.get("capacity_source"),
        "save_all_fits": decision.get("save_all_fits"),
        "fit_decision": decision,
        "link": first.get("link"),
        "matmul": first.get("matmul"),
        "calibration": first.get("calibration"),
        "time_model": time_model_summary(runs),
        "planner": next(
            (r.get("planner") for r in runs if r.get("planner")), {"status": "planner: not run"}
        ),
        "runs": runs,
        "wall_s": _now() - start,
        "budget_s": args.budget_s,
        "flops_convention": "MaxText: 6·matmul params·tokens + 3·causal attention "
        "(tierax.models.flops); MFU against the bf16 matmul rate measured here",
        "notes": [
            "peak HBM: the allocator's bytes added by the plan at its high-water mark "
            "(memory_stats); host bytes: compiled (memory_analysis host_*), memory_stats reports "
            "no pinned-host usage",
            "exposed transfer: from a profile of the plan's steps (tierax.measure.trace)",
        ]
        + (
            [
                "tiny mode on CPU: offloading is a no-op on XLA:CPU; no transfer, bandwidth or "
                "offload claim can be made from this file",
                (
                    "tiny mode on CPU: steps of a few milliseconds are mostly per-op dispatch, "
                    "which the time model does not count; its predicted-vs-measured rows rehearse "
                    "the pipeline and check nothing (bench/time_fidelity.py checks the model on a "
                    "CPU)"
                ),
            ]
            if args.tiny
            else []
        ),
    }
    _common.write_record(out, doc)
    print(f"wrote {out}")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
