#!/usr/bin/env python3
"""One prepared check of tierax on one TPU v5e chip (≤ 9 minutes), and its CPU rehearsal (--tiny).

On the TPU machine (Python 3.11, jax 0.10.2 with libtpu; flax, optax, orbax-checkpoint, rich, pyyaml
and matplotlib installed from its own package index), from the repository root:

    PYTHONPATH=src python3 bench/tpu_check.py --out $OUT/tpu_check.json
    PYTHONPATH=src python3 bench/tpu_check.py --tiny --out /tmp/tpu_check.json   # CPU rehearsal
    PYTHONPATH=src python3 bench/tpu_check.py --cases dense:8,moe:16 --stages cases,boundary
    # (some cases and stages only, into their own --out; --render takes several records)
    python bench/tpu_check.py --render bench/results/tpu_check.json   # the docs page and its plot

What it does, in one process (one program holds the chip), every stage against ``--budget-s``:

1. ``tierax calibrate``'s TPU measurements (:func:`tierax.measure.calibrate.measure_tpu`): a
   layer's non-matmul work, bf16 GEMMs at a step's shapes and by smallest dimension, the splash
   kernel forward and backward by sequence and head dim, the host link through the step's own
   offload path beside compute.  That entry is the *calibrated* rates; the datasheet rates of
   ``v5e`` the *uncalibrated* ones.
2. Three model shapes — a Llama-style dense model (the 0.63 B shape of the first chip run), a
   Mixtral-style MoE and a DeepSeek-style MLA + MoE — at three microbatches each: every preset
   that applies and the planner's plan under the calibrated rates (and under the datasheet ones
   where it differs) run with :func:`tierax.measure.bench.run_bench` (one plan on the chip at a
   time; a plan the chip refuses is recorded as not fitting), each beside the model's prediction
   (step time, fit, device and host bytes) under both sets of rates.  ``--models dense-8k`` and
   ``dense-hd64`` add the dense shape at seq 8192 and at head dim 64 (not run by default).
   ``--planned-from MODEL:MB=PLAN.yaml,...`` takes plan files as the planner's plans of those cases
   (the chip check's seventeenth record: the plans `tierax plan --check` chose with XLA:TPU's
   deviceless compile, bench/results/chip/tpu_check_checked.json).  ``--checked`` runs
   ``tierax plan --check`` itself for the calibrated planner's plan (its compiles on the attached
   chip at this run's rates; --tiny: deviceless) and compiles every plan of the case, each row
   then carrying its compiled step (the model's with XLA's own recompute and the loads its schedule
   exposes beyond the model's) beside the chip's.  ``--cases dense-state:32`` is the dense shape
   where only training state on the host fits; its ``<preset>+state`` plans are the preset's
   placements with the planner's state (bench/results/chip/tpu_check_state.json, _mb40.json).
3. The fit boundary of remat-full on the dense model, found on the chip (doubling, then
   bisection on the chip's own out-of-memory errors) beside the planner's predicted largest
   microbatch.
4. tierax's step beside ``bench/reference_step.py`` (a pure-JAX Llama step) at the same shape and
   remat (full), each timed alone.

The record is written after every case, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import _common  # noqa: E402 — it imports tierax, found through SRC

SCHEMA = "tierax.tpu-check/1"
STAGES = ("cases", "reference", "boundary")
TARGET = "v5e"
GIB = 2**30
_T0 = time.perf_counter()

# (name, base config, overrides, seq, microbatches, presets).  Chip sizes; --tiny keeps the shapes'
# kinds at toy sizes.
CASES = (
    (
        "dense",
        "tiny-llama",
        [
            "d_model=2048",
            "num_layers=8",
            "mlp_dim=8192",
            "num_heads=16",
            "num_kv_heads=8",
            "head_dim=128",
            "vocab_size=32000",
            "dtype=bfloat16",
            "attention=auto",
        ],
        2048,
        (8, 4, 16),
        ("save-all", "remat-full", "minimal", "qkv-offload"),
    ),
    (
        "moe",
        "tiny-mixtral",
        [
            "d_model=1024",
            "num_layers=4",
            "mlp_dim=2048",
            "num_heads=8",
            "num_kv_heads=8",
            "head_dim=128",
            "vocab_size=32000",
            "dtype=bfloat16",
            "attention=auto",
            "num_experts=8",
            "num_experts_per_tok=2",
        ],
        2048,
        (8, 4, 16),
        ("remat-full", "minimal", "qkv-offload"),
    ),
    (
        "mla-moe",
        "tiny-deepseek",
        [
            "d_model=1024",
            "num_layers=4",
            "first_dense_layers=1",
            "num_heads=8",
            "q_lora_rank=384",
            "kv_lora_rank=256",
            "qk_nope_head_dim=64",
            "qk_rope_head_dim=64",
            "v_head_dim=64",
            "dense_mlp_dim=4096",
            "num_experts=8",
            "num_experts_per_tok=2",
            "expert_mlp_dim=1024",
            "vocab_size=32000",
            "dtype=bfloat16",
            "attention=auto",
        ],
        2048,
        (8, 4, 16),
        ("remat-full", "minimal", "deepseek-offload"),
    ),
)
_DENSE = [
    "d_model=2048",
    "num_layers=8",
    "mlp_dim=8192",
    "num_kv_heads=8",
    "vocab_size=32000",
    "dtype=bfloat16",
    "attention=auto",
]
# Cases run only when --models names them: the dense shape at a long sequence (the splash kernel at
# seq 8192) and at head dim 64 (32 heads of 64 for the same width), where the step's attention
# rates are the kernel table's other points.
EXTRA_CASES = (
    ("dense-8k", "tiny-llama", [*_DENSE, "num_heads=16", "head_dim=128"], 8192, (2, 1, 3),
     ("remat-full", "qkv-offload")),
    ("dense-hd64", "tiny-llama", [*_DENSE, "num_heads=32", "head_dim=64"], 2048, (8, 4),
     ("remat-full", "qkv-offload")),
    # microbatches only state offload fits (remat-full alone stops at 24-27 on the chip), where
    # XLA's own rematerialization adds compute: "<preset>+state" is the preset's placements with
    # the calibrated planner's training state (plan --check's alternatives)
    ("dense-state", "tiny-llama", [*_DENSE, "num_heads=16", "head_dim=128"], 2048, (32, 40),
     ("remat-full+state", "qkv-offload+state")),
)  # fmt: skip
TINY_OVERRIDES = {
    "dense": ["dtype=bfloat16", "attention=auto"],
    "dense-8k": ["dtype=bfloat16", "attention=auto"],
    "dense-hd64": ["dtype=bfloat16", "attention=auto", "num_heads=8", "head_dim=8"],
    "dense-state": ["dtype=bfloat16", "attention=auto"],
    "moe": ["dtype=bfloat16", "attention=auto"],
    "mla-moe": ["dtype=bfloat16", "attention=auto"],
}
TINY = {"seq": 128, "microbatches": (2, 4), "steps": 2, "budget_s": 600}
CHIP = {"steps": 3, "budget_s": 540}
REFERENCE_SHAPE = {"d_model": 2048, "layers": 8, "seq": 2048, "batch": 4, "vocab": 32000}
# --tiny's: a vocabulary of 1024 (the head's GEMM and the loss at 32k are most of a toy step's time)
TINY_REFERENCE_SHAPE = {"d_model": 128, "layers": 2, "seq": 128, "batch": 2, "vocab": 1024}


def elapsed() -> float:
    return time.perf_counter() - _T0


def write(doc: dict, out: pathlib.Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


# --- rates ----------------------------------------------------------------------------------


def calibrate_here(tiny: bool) -> dict:
    """The calibration entry of this device (the chip: tierax calibrate's TPU stages; --tiny: the
    same functions at toy sizes on the CPU, Pallas interpreted)."""
    from tierax.measure import accel_rates, calibrate

    if not tiny:
        return calibrate.measure_tpu()
    import jax

    mix = accel_rates.gemm_rates([(256, 128, 256)])
    splash = accel_rates.splash_rates([(128, 64)], tokens=128, kv_heads=1, groups=1, interpret=True)
    link = accel_rates.host_link_rates(tiny=True)
    entry = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device_kind": jax.devices()[0].device_kind,
        "matmul_flops_per_s_bfloat16": mix["flops_per_s"],
        "matmul_flops_per_s_float32": mix["flops_per_s"],
        "matmul_size_rates_bfloat16": [[64, mix["flops_per_s"] / 2], [128, mix["flops_per_s"]]],
        "fused_attention_fwd_flops_per_s": splash[0]["fwd_flops_per_s"],
        "fused_attention_bwd_flops_per_s": splash[0]["bwd_flops_per_s"],
        "splash_attention": [[128, 64, splash[0]["fwd_flops_per_s"], splash[0]["bwd_flops_per_s"]]],
        "microbenchmarks": {"host_link": link},
    }
    if link["d2h_bytes_per_s"] and link["h2d_bytes_per_s"]:
        entry["d2h_bytes_per_s"] = link["d2h_bytes_per_s"]
        entry["h2d_bytes_per_s"] = link["h2d_bytes_per_s"]
    return measure_indexed(entry, tiny)


# --tiny's gathers and scatters: the chip's shapes in kind (a dispatch into a buffer 4 × the rows, a
# combine's gradient into one 4 × smaller), at sizes XLA:CPU runs in milliseconds (the chip's take
# seconds a call there).
TINY_INDEXED = {
    "INDEX_LOOKUPS": 4096,
    "INDEX_SOURCE": 2048,
    "SCATTER_CASES": ((512, 2048), (2048, 512)),
    "SCATTER_WIDTH": 128,
}


def measure_indexed(entry: dict, tiny: bool) -> dict:
    """``entry`` with the gathers' and scatters' rates measured here (an entry from before they
    were measured has none); --tiny at :data:`TINY_INDEXED`'s sizes."""
    from tierax.measure import accel_rates, calibrate

    if not tiny:
        return calibrate.with_indexed(entry, calls=20)
    chip = {k: getattr(accel_rates, k) for k in TINY_INDEXED}
    vars(accel_rates).update(TINY_INDEXED)
    try:
        return calibrate.with_indexed(entry, calls=3)
    finally:
        vars(accel_rates).update(chip)


def reuse_calibration(record: pathlib.Path, tiny: bool, link: bool = True) -> dict:
    """An earlier check's calibration entry with the host link measured again here (and the
    gathers' and scatters' rates, where that entry has none); ``link`` False: the entry as the
    record holds it, nothing measured."""
    from tierax.measure import accel_rates

    entry = dict(json.loads(record.read_text())["calibration"])
    if not link:
        return entry | {"rates_from": f"{record.name} (as recorded: nothing measured again)"}
    indexed = "index_op_s" in entry
    link = accel_rates.host_link_rates(tiny)
    entry["microbenchmarks"] = dict(entry.get("microbenchmarks", {}), host_link=link)
    again = "host link" if indexed else "host link, gathers and scatters"
    entry["rates_from"] = f"{record.name} ({again} measured again in this run)"
    for way in ("d2h", "h2d"):
        entry.pop(f"{way}_bytes_per_s", None)
        if link[f"{way}_bytes_per_s"]:
            entry[f"{way}_bytes_per_s"] = link[f"{way}_bytes_per_s"]
    return entry if indexed else measure_indexed(entry, tiny)


def rate_sets(dtype: str, entry: dict) -> dict:
    """{"uncalibrated": the v5e default rates (tierax.hardware.tpu_rates), "calibrated": this
    run's measured ones}."""
    from tierax import costmodel as cm

    return {
        "uncalibrated": cm.target_rates(TARGET, dtype, calibration={}),
        "calibrated": cm.target_rates(TARGET, dtype, calibration={TARGET: entry}),
    }


# --- one case ---------------------------------------------------------------------------------


def config_for(name: str, base: str, overrides: list, tiny: bool):
    from tierax import launch
    from tierax.models import apply_overrides, get_config

    cfg = apply_overrides(get_config(base), TINY_OVERRIDES[name] if tiny else overrides)
    return launch.local_attention(cfg, what="tpu_check")


def predict(plan, prog, rates) -> dict:
    from tierax import costmodel as cm

    p = cm.simulate(plan, prog, rates, "lhs", 1)
    return {
        "fits": p.fits,
        "step_time_s": p.step_time_s,
        "peak_device_bytes": p.peak_device_bytes,
        "host_bytes": p.host_bytes,
        "copies_serialized": p.breakdown.copies_serialized,
    }


def planned(prog, rates, label: str):
    """The planner's plan under ``rates`` within the chip's limit less :data:`FIT_MARGIN` (None
    and the reason where nothing fits)."""
    from tierax.errors import TieraxError
    from tierax.solving import planner

    budget = rates.usable_device_bytes * (1 - FIT_MARGIN["margin"])
    try:
        return (
            planner.plan(
                prog, rates, schedule="lhs", budget_bytes=budget, name=f"planned-{label}"
            ).plan,
            None,
        )
    except TieraxError as e:
        return None, str(e).splitlines()[0]


# (case, microbatch) → a plan file taken as the planner's plan for that case (--planned-from): a
# plan `tierax plan --check` chose where XLA:TPU's deviceless compile runs
# (tierax.solving.plan_check).
PLANNED_FROM: dict[tuple[str, int], pathlib.Path] = {}


def planned_from(spec: str) -> dict[tuple[str, int], pathlib.Path]:
    """``--planned-from``'s ``MODEL:MICROBATCH=PLAN.yaml,...``; raises ValueError naming the bad
    item (a missing file included)."""
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        case, eq, path = item.partition("=")
        name, _, mb = case.partition(":")
        if not eq or not mb.isdigit() or not path:
            raise ValueError(f"--planned-from item {item!r} is not MODEL:MICROBATCH=PLAN.yaml")
        f = pathlib.Path(path)
        if not f.is_file():
            raise ValueError(f"--planned-from: no plan file {path!r} (for {case})")
        out[(name, int(mb))] = f
    return out


# The share of the chip's limit the planner leaves free: 0, or (--margin-from RECORD) the largest
# amount by which XLA:TPU's peak exceeded the model's prediction in an earlier check's plans.
FIT_MARGIN = {"margin": 0.0, "source": "none"}


def fit_margin_from(record: pathlib.Path) -> dict:
    """The worst under-prediction of a plan's device peak in ``record``: XLA:TPU's compiled peak of
    the plans that ran, the "required" bytes its out-of-memory message states for those it refused
    (libtpu's "G" is GiB), over the calibrated prediction."""
    import re

    doc = json.loads(record.read_text())
    misses = []
    for case in doc.get("cases", []):
        for p in case.get("plans", []):
            pred = p["predicted_calibrated"]["peak_device_bytes"]
            got = p.get("peak_device_bytes_compiled") if p.get("ran") else None
            m = re.search(r"HLO temporaries \(([\d.]+)G\)", p.get("error", ""))
            got = got or (float(m.group(1)) * GIB if m else None)
            if got and pred:
                where = f"{case['model']} mb {case['microbatch']} {p['plan']}"
                misses.append((got / pred - 1, where))
    worst = max(misses) if misses else (0.0, "none")
    return {"margin": max(0.0, worst[0]), "source": f"{record.name}: {worst[1]}", "misses": misses}


# --checked: the planner's calibrated plan is `tierax plan --check`'s, every plan is compiled for
# the target (on the attached chip; --tiny: deviceless) and carries the compiled step
CHECKED = {"on": False}


def _preset_plans(presets, cfg, state_from):
    """The case's presets; ``<preset>+state`` takes ``state_from``'s training state (none: left
    out, with a note)."""
    from tierax import plan as plan_lib
    from tierax.solving import plan_check

    plans, notes = [], []
    for name in presets:
        base, plus, _ = name.partition("+")
        if not plus:
            plans.append(plan_lib.preset(name, cfg))
        elif state_from is not None and any(sp.offloaded for sp in state_from.state.values()):
            plans.append(plan_check.with_state_of(base, cfg, state_from))
        else:
            notes.append(f"{name}: the planner's plan offloads no training state")
    return plans, notes


def check_on_target(cfg, mb: int, seq: int, rates):
    """``tierax plan --check`` of the case at ``rates`` for the target: compiled on the attached
    chip (--tiny: XLA:TPU's deviceless compile).  Returns (the check's result, [(plan, compile)]
    of every plan it compiled, in order)."""
    from tierax.solving import plan_check, planner, planning

    request = planning.Request(cfg, {"data": 1, "fsdp": 1}, rates, microbatch=mb, seq=seq)
    compile_one, compiled = plan_check.tierax_compile(request, TARGET), []

    def compile_plan(result):  # the check's own compile, each one kept
        compiled.append((result.plan, compile_one(result)))
        return compiled[-1][1]

    checked = plan_check.check_request(
        request,
        TARGET,
        compile_plan=compile_plan,
        correct_loads=planner.scheduler_limit(rates) > 0,
        report=lambda it: print(f"  check: {plan_check.iteration_line(it)}", flush=True),
    )
    return checked, compiled


def compiled_figures(res) -> dict:
    """A compile's figures beside the measured step: the model's step with what XLA's program adds
    (its own recompute, loads exposed beyond the model's), its peak and host bytes."""
    out = {
        "compiled_on": res.compiled_on or "deviceless",
        "libtpu": res.libtpu_version,
        "fits": bool(res.fits),
        "device_peak_bytes": res.device_peak_bytes,
        "peak_over_reported": res.peak_over_reported,
    }
    if res.fits:
        out |= {
            "host_bytes": (res.host_temp_bytes or 0) + (res.host_argument_bytes or 0),
            "model_step_s": res.predicted["model_step_s"],
            "compiled_step_s": res.predicted["compiled_step_s"],
            "xla_recompute_s": res.xla_recompute.get("est_s", 0.0),
            "xla_recompute_instructions": res.xla_recompute.get("instructions", 0),
        }
    return out


def run_case(name: str, cfg, seq: int, mb: int, presets, rates: dict, steps: int) -> dict:
    """Every plan of one (model, microbatch) on the device beside both predictions (and with
    --checked the compiled step of each)."""
    from tierax.measure import bench
    from tierax.tracing.model_program import program_of

    t0 = time.perf_counter()
    prog = program_of(cfg, mb, seq, {"data": 1, "fsdp": 1})
    notes, planner_chose, chosen, check = [], {}, {}, []
    compiles: dict = {}  # placements → XLA's compile of them
    given = PLANNED_FROM.get((name, mb))
    for label in ("calibrated", "uncalibrated"):
        if given is not None:
            from tierax.plan.presets import load_plan

            plan, why = load_plan(str(given), cfg), None
            plan = dataclasses.replace(plan, name=f"planned-{label}")
            notes.append(f"planner ({label}): the plan in {given} (--planned-from)")
        elif CHECKED["on"] and label == "calibrated":
            checked, done = check_on_target(cfg, mb, seq, rates[label])
            notes.append(f"plan --check ({label}): {checked.stopped}")
            check = [(it.to_json(), placements(p, cfg)) for it, (p, _) in zip(
                checked.iterations, done, strict=True)]  # fmt: skip
            plan, why = dataclasses.replace(done[0][0], name=f"planned-{label}"), None
            for i, (p, res) in enumerate(done):
                pname = plan.name if i == 0 else (p.name if "+" in p.name else f"checked-{i + 1}")
                compiles.setdefault(placements(p, cfg), (dataclasses.replace(p, name=pname), res))
            chosen["checked"] = checked.result.plan
        else:
            plan, why = planned(prog, rates[label], label)
        if plan is None:
            notes.append(f"planner ({label}): {why}")
            continue
        chosen[label] = plan
    preset_plans, why_not = _preset_plans(presets, cfg, chosen.get("calibrated"))
    notes += why_not
    plans = list(preset_plans)
    for p, _ in compiles.values():  # the check's compiled plans, a preset's name kept where same
        if not any(placements(q, cfg) == placements(p, cfg) for q in plans):
            plans.append(p)
    for label, plan in chosen.items():
        same = next((p for p in plans if placements(p, cfg) == placements(plan, cfg)), None)
        if same is None:
            plans.append(plan)
            same = plan
        elif label != "checked" and same.name != plan.name:
            notes.append(f"planner ({label}) chose the same placements as {same.name}")
        planner_chose[label] = same.name
    # each compile of the check under the name of the case's plan of the same placements
    check = [it | {"plan": next(q.name for q in plans if placements(q, cfg) == key)}
             for it, key in check]  # fmt: skip
    if CHECKED["on"]:  # the plans the check did not compile
        from tierax.xla.compile import compile_for_target

        for p in plans:
            if placements(p, cfg) not in compiles:
                res = compile_for_target(cfg, p, TARGET, microbatch=mb, seq=seq)[0]
                compiles[placements(p, cfg)] = (p, res)
    trace_s = time.perf_counter() - t0
    records, peaks, not_run = bench.run_bench(
        cfg, plans, steps=steps, microbatch=mb, seq=seq, warmup=1, rounds=1, peaks=PEAKS.get(name)
    )
    PEAKS.setdefault(name, peaks)
    measured = {r.plan: r for r in records}
    refused = {n.plan: n for n in not_run}
    rows = []
    for p in plans:
        row: dict = {"plan": p.name, "placements": p.to_dict()}
        for label, r in rates.items():
            row[f"predicted_{label}"] = predict(p, prog, r)
        if placements(p, cfg) in compiles:
            row["compiled"] = compiled_figures(compiles[placements(p, cfg)][1])
        if p.name in measured:
            m = measured[p.name]
            row |= {
                "ran": True,
                "step_time_s": m.step_time_s,
                "step_times_s": list(m.step_times_s),
                "tflops_per_device": m.tflops_per_device,
                "mfu": m.mfu,
                "peak_device_bytes_compiled": m.peak_device_bytes_compiled,
                "host_bytes_compiled": m.host_bytes_compiled,
                "compile_time_s": m.compile_time_s,
                "loss": m.loss,
            }
            for label in rates:
                pred = row[f"predicted_{label}"]["step_time_s"]
                row[f"time_error_{label}"] = pred / m.step_time_s - 1
            if "compiled_step_s" in row.get("compiled", {}):
                row["time_error_compiled"] = row["compiled"]["compiled_step_s"] / m.step_time_s - 1
        else:
            n = refused.get(p.name)
            row |= {
                "ran": False,
                "out_of_memory": bool(n and n.out_of_memory),
                "error": n.error if n else "not run",
            }
        rows.append(row)
    return {
        "model": name,
        "microbatch": mb,
        "seq": seq,
        "plans": rows,
        "planner_chose": planner_chose,
        "notes": notes,
        "check": check,  # --checked: plan --check's compiles, in order
        "trace_and_plan_s": trace_s,
        "wall_s": time.perf_counter() - t0,
        "peaks": dataclasses.asdict(peaks),
        "summary": summarize(rows, planner_chose),
    }


PEAKS: dict = {}  # the step-shape GEMM peak measured once per model


def placements(plan, cfg) -> tuple:
    """What a plan does, without its name: every name's placement per group, its state, its
    mechanism."""
    from tierax import plan as plan_lib

    resolved = {
        g: {n: pl.value for n, pl in d.items()} for g, d in plan_lib.resolve(plan, cfg).items()
    }
    state = {g: sp.to_dict() for g, sp in plan.state.items() if sp.offloaded}
    return json.dumps(resolved, sort_keys=True), json.dumps(state, sort_keys=True), plan.mechanism


def summarize(rows: list, planner_chose: dict) -> dict:
    """The figures the issue asks of a case: the planner's plan against the measured fastest, the
    time errors, fit verdicts and host bytes."""
    ran = [r for r in rows if r.get("ran")]
    out: dict = {}
    if ran:
        fastest = min(ran, key=lambda r: r["step_time_s"])
        out["measured_fastest"] = fastest["plan"]
        for label in ("calibrated", "uncalibrated", "checked"):
            mine = next((r for r in ran if r["plan"] == planner_chose.get(label)), None)
            if mine is not None:
                out[f"planner_{label}_vs_fastest"] = (
                    mine["step_time_s"] / fastest["step_time_s"] - 1
                )
        for label in ("calibrated", "uncalibrated", "compiled"):
            errs = [abs(r[f"time_error_{label}"]) for r in ran if f"time_error_{label}" in r]
            if errs:
                out[f"worst_time_error_{label}"] = max(errs)
    verdicts = []
    for r in rows:
        pred_fit = r["predicted_calibrated"]["fits"]
        actual = r.get("ran") or not r.get("out_of_memory")
        verdicts.append(pred_fit == actual)
    out["fit_verdicts_right"] = f"{sum(verdicts)}/{len(verdicts)}"
    host = [
        (r["predicted_calibrated"]["host_bytes"], r["host_bytes_compiled"])
        for r in ran
        if r.get("host_bytes_compiled")
    ]
    if host:
        out["worst_host_error"] = max(abs(p / c - 1) for p, c in host)
    recompute = [r["compiled"].get("xla_recompute_s", 0.0) for r in ran if "compiled" in r]
    if recompute:
        out["largest_xla_recompute_s"] = max(recompute)
    return out


# --- boundary and reference ------------------------------------------------------------------


def boundary(cfg, seq: int, start: int, rates: dict) -> dict:
    from tierax import plan as plan_lib
    from tierax.measure import bench
    from tierax.tracing.model_program import program_of

    plan = plan_lib.preset("remat-full", cfg)
    found = bench.largest_fitting_microbatch(cfg, plan, seq=seq, start=start)
    predicted = {}
    for label, r in rates.items():
        fits = []
        for mb in sorted({found["microbatch"], found["refused_at"] or 0} - {0}):
            prog = program_of(cfg, mb, seq, {"data": 1, "fsdp": 1})
            fits.append([mb, predict(plan, prog, r)["fits"]])
        predicted[label] = fits
    return {"plan": "remat-full", "seq": seq, "on_chip": found, "predicted_fits": predicted}


def reference(tiny: bool, steps: int) -> dict:
    """tierax's remat-full step against bench/reference_step.py at one shape (same model: MHA,
    head dim 64, MLP 4·d, untied head, XLA attention, bf16 compute, float32 AdamW state)."""
    import jax

    sys.path.insert(0, str(ROOT / "bench"))
    import reference_step

    from tierax import plan as plan_lib
    from tierax.measure import bench
    from tierax.models import apply_overrides, get_config

    s = TINY_REFERENCE_SHAPE if tiny else REFERENCE_SHAPE
    d = s["d_model"]
    cfg = apply_overrides(
        get_config("tiny-llama"),
        [
            f"d_model={d}",
            f"num_layers={s['layers']}",
            f"mlp_dim={4 * d}",
            f"num_heads={d // 64}",
            f"num_kv_heads={d // 64}",
            "head_dim=64",
            f"vocab_size={s['vocab']}",
            "dtype=bfloat16",
            "attention=xla",
        ],
    )
    records, _, not_run = bench.run_bench(
        cfg,
        [plan_lib.preset("remat-full", cfg)],
        steps=steps,
        microbatch=s["batch"],
        seq=s["seq"],
        warmup=1,
        rounds=1,
    )
    step, state, tokens = reference_step.make(
        d_model=d,
        dtype="bfloat16",
        remat="full",
        layers=s["layers"],
        vocab=s["vocab"],
        batch=s["batch"],
        seq=s["seq"],
    )
    state, _ = step(state, tokens)
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = step(state, tokens)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    out = {
        "shape": s,
        "reference_step_s": statistics.median(times),
        "reference_times_s": times,
        "reference_loss": float(metrics["loss"]),
    }
    if records:
        out |= {
            "tierax_step_s": records[0].step_time_s,
            "tierax_times_s": list(records[0].step_times_s),
            "tierax_over_reference": records[0].step_time_s / out["reference_step_s"],
        }
    else:
        out["tierax_error"] = not_run[0].error if not_run else "did not run"
    return out


# --- main -----------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU rehearsal at toy sizes")
    ap.add_argument(
        "--out",
        type=_common.out_path,
        help="the record (default bench/results/tpu_check.json on a TPU)",
    )
    ap.add_argument("--budget-s", type=float, help="stop starting stages after this many seconds")
    ap.add_argument(
        "--models",
        help="comma-separated subset of: dense, moe, mla-moe (the default), dense-8k, dense-hd64",
    )
    ap.add_argument(
        "--microbatches", help="comma-separated microbatches for every model (default: each one's)"
    )
    ap.add_argument(
        "--cases",
        help="comma-separated MODEL:MICROBATCH pairs to run, and no others (in place of --models "
        "and --microbatches)",
    )
    ap.add_argument("--skip", default="", help="MODEL:PRESET pairs not to run, comma-separated")
    ap.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated stages to run after the calibration (default: {','.join(STAGES)})",
    )
    ap.add_argument(
        "--calibration",
        metavar="RECORD",
        help="take the rates an earlier check measured (its record) and measure only the host link",
    )
    ap.add_argument(
        "--as-recorded",
        action="store_true",
        help="with --calibration: take its host link as recorded too (nothing measured again)",
    )
    ap.add_argument(
        "--margin-from",
        metavar="RECORD",
        help="plan within the chip's limit less the worst peak under-prediction in RECORD",
    )
    ap.add_argument(
        "--planned-from",
        metavar="MODEL:MB=PLAN.yaml,...",
        default="",
        help="take these plan files as the planner's plans of those cases (e.g. plans "
        "`tierax plan --check` chose with XLA:TPU's deviceless compile)",
    )
    ap.add_argument(
        "--checked",
        action="store_true",
        help="the planner's calibrated plan by `tierax plan --check` (XLA:TPU's compile on the "
        "attached chip; --tiny: deviceless), and every plan compiled for the compiled step",
    )
    ap.add_argument(
        "--render",
        metavar="RECORD",
        nargs="+",
        help="write the docs page and plot from these records (no run)",
    )
    args = ap.parse_args(argv)
    if args.render:
        sys.path.insert(0, str(ROOT / "bench"))
        import _tpu_check_report as tpu_check_report

        for f in tpu_check_report.render([pathlib.Path(r) for r in args.render]):
            print(f"wrote {f}")
        return 0
    try:
        PLANNED_FROM.update(planned_from(args.planned_from))
    except ValueError as e:
        print(f"tpu_check: {e}", file=sys.stderr)
        return 2
    if args.as_recorded and not args.calibration:
        print("tpu_check: --as-recorded takes the rates of --calibration RECORD; give one",
              file=sys.stderr)  # fmt: skip
        return 2
    stages = [x.strip() for x in args.stages.split(",")]
    if bad := [x for x in stages if x not in STAGES]:
        print(
            f"tpu_check: unknown stage(s) {', '.join(bad)}; choose from {STAGES}", file=sys.stderr
        )
        return 2
    names = [c[0] for c in CASES]
    known = names + [c[0] for c in EXTRA_CASES]
    chosen = names if not args.models else [m.strip() for m in args.models.split(",")]
    pairs: dict[str, tuple[int, ...]] = {}
    if args.cases:
        if args.models or args.microbatches:
            print(
                "tpu_check: give --cases alone, not with --models/--microbatches", file=sys.stderr
            )
            return 2
        for item in args.cases.split(","):
            name, _, mb = item.strip().partition(":")
            if not mb.isdigit() or int(mb) < 1:
                print(
                    f"tpu_check: --cases item {item!r} is not MODEL:MICROBATCH (e.g. dense:8)",
                    file=sys.stderr,
                )
                return 2
            pairs[name] = (*pairs.get(name, ()), int(mb))
        chosen = list(pairs)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        print(
            f"tpu_check: unknown model(s) {', '.join(unknown)}; choose from {known}",
            file=sys.stderr,
        )
        return 2
    out = (
        pathlib.Path(args.out)
        if args.out
        else (None if args.tiny else ROOT / "bench" / "results" / "tpu_check.json")
    )
    from tierax import launch
    from tierax.launch import flags as xla_flags

    CHECKED["on"] = args.checked
    if args.tiny and args.checked:  # the CPU runs the steps; XLA:TPU compiles deviceless
        launch.start_deviceless_tpu("none", "v5litepod-1")
    else:  # libtpu gets the step's TPU options, as a run's and plan --check's compiles do
        xla_flags.configure(
            platforms="cpu" if args.tiny else None, run_step=True, env=xla_flags.libtpu_env()
        )
    import jax

    from tierax.records import envelope

    if not args.tiny and jax.default_backend() != "tpu":
        print(
            f"tpu_check: JAX started {jax.default_backend()}, not a TPU; use --tiny off a TPU",
            file=sys.stderr,
        )
        return 2
    p = TINY if args.tiny else CHIP
    budget = args.budget_s or p["budget_s"]
    doc = envelope(SCHEMA, " ".join(["python", "bench/tpu_check.py", *(argv or sys.argv[1:])]))
    doc |= {"target": TARGET, "tiny": args.tiny, "cases": [], "skipped": [], "stages_s": {}}
    print(f"tpu_check on {jax.devices()[0].device_kind} ({jax.default_backend()})", flush=True)
    if args.margin_from:
        FIT_MARGIN.update(fit_margin_from(pathlib.Path(args.margin_from)))
    doc["fit_margin"] = dict(FIT_MARGIN)
    t = time.perf_counter()
    try:
        if args.calibration:
            entry = reuse_calibration(
                pathlib.Path(args.calibration), args.tiny, not args.as_recorded
            )
        else:
            entry = calibrate_here(args.tiny)
    except Exception:  # noqa: BLE001 — without measured rates the datasheet ones still check
        entry = {}
        doc["calibration_error"] = traceback.format_exc()[-2000:]
    doc["calibration"] = entry
    doc["stages_s"]["calibrate"] = time.perf_counter() - t
    # --checked: the compiles price at this run's rates, not a calibration file's (the directory
    # is removed when main returns)
    rates_dir = tempfile.TemporaryDirectory(prefix="tpu_check_rates_") if args.checked else None
    if rates_dir is not None:
        cal_file = pathlib.Path(rates_dir.name) / "calibration.json"
        cal_file.write_text(json.dumps({TARGET: entry} if entry else {}))
        os.environ["TIERAX_CALIBRATION"] = str(cal_file)
    write(doc, out)
    print(f"calibrated in {doc['stages_s']['calibrate']:.0f} s", flush=True)
    dense_cfg, models = None, {}
    for name, base, overrides, seq, mbs, presets in (*CASES, *EXTRA_CASES):
        if name == "dense" and "boundary" in stages:  # the boundary's model, its cases run or not
            dense_cfg = config_for(name, base, overrides, args.tiny)
        if name in chosen and "cases" in stages:
            cfg = config_for(name, base, overrides, args.tiny)
            mbs = TINY["microbatches"] if args.tiny else mbs
            if args.microbatches:
                mbs = tuple(int(m) for m in args.microbatches.split(","))
            mbs = pairs.get(name, mbs)
            models[name] = (
                cfg,
                rate_sets(cfg.dtype, entry),
                TINY["seq"] if args.tiny else seq,
                mbs,
                presets,
            )
    # Microbatch-major: each model's first microbatch before any model's second, so a run cut
    # short by the budget still has every model.
    order = [
        (name, mb_i)
        for mb_i in range(max((len(m[3]) for m in models.values()), default=0))
        for name, m in models.items()
        if mb_i < len(m[3])
    ]
    for name, mb_i in order:
        cfg, rates, seq, mbs, presets = models[name]
        presets = [pr for pr in presets if f"{name}:{pr}" not in args.skip.split(",")]
        mb = mbs[mb_i]
        if elapsed() > budget:
            doc["skipped"].append(f"{name} microbatch {mb}: over the {budget:.0f} s budget")
            continue
        try:
            case = run_case(name, cfg, seq, mb, presets, rates, p["steps"])
        except Exception:  # noqa: BLE001 — one case's fault is that case's record
            case = {"model": name, "microbatch": mb, "error": traceback.format_exc()[-3000:]}
        doc["cases"].append(case)
        write(doc, out)
        print(
            f"{name} mb {mb}: {json.dumps(case.get('summary', case.get('error')))[:400]}",
            flush=True,
        )
    for stage, fn in (
        ("reference", lambda: reference(args.tiny, p["steps"])),
        (
            "boundary",
            lambda: boundary(
                dense_cfg,
                TINY["seq"] if args.tiny else 2048,
                2 if args.tiny else 16,
                rate_sets(dense_cfg.dtype, entry),
            ),
        ),
    ):
        if stage not in stages:
            continue
        if stage == "boundary" and (dense_cfg is None or args.tiny):
            doc["skipped"].append("boundary: the dense model only, on a device that can refuse")
            continue
        if elapsed() > budget:
            doc["skipped"].append(f"{stage}: over the {budget:.0f} s budget")
            continue
        t = time.perf_counter()
        try:
            doc[stage] = fn()
        except Exception:  # noqa: BLE001
            doc[stage] = {"error": traceback.format_exc()[-3000:]}
        doc["stages_s"][stage] = time.perf_counter() - t
        write(doc, out)
        print(f"{stage}: {json.dumps(doc[stage], default=str)[:400]}", flush=True)
    doc["wall_s"] = elapsed()
    write(doc, out)
    print(f"done in {doc['wall_s']:.0f} s" + (f"; wrote {out}" if out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
