#!/usr/bin/env python3
"""The time model against a clock: predicted step times (``simulate --target cpu``) vs measured
ones on this machine's CPU, for Llama- and DeepSeek-style shapes under save-all, minimal,
remat-full and the planner's plan.

    PYTHONPATH=src python bench/time_fidelity.py [--quick] [--rounds 7] [--shapes NAME,...]
                                                 [--out bench/results/time_fidelity.json]

1. The calibration first (:func:`tierax.measure.calibrate.measure`: microbenchmarks that share
   no shape with any case below), in this run, so that it sees the machine as the cases do; it
   is frozen: every prediction uses it, no parameter is set per case.  The calibration file
   (``~/.cache/tierax``) is neither read nor written.  On a shared machine whose load changes
   during the run the same microbenchmarks also run once per round inside each shape's process
   (step 2), and the record gives a second prediction from their medians ("interleaved"),
   beside the frozen one, never in its place.
2. Per shape, a process of its own (no allocator state, buffers or compiled programs shared
   between shapes): the model's prediction for each plan (the planner's plan is the fastest
   predicted plan within a device budget halfway between remat-full's and save-all's predicted
   peaks, so that it has to choose), then every plan compiled and warmed up, then interleaved
   rounds — the calibration's microbenchmarks, then of each plan, the order rotating, ``--settle``
   untimed steps (default 1) and one timed step — each step timed alone, with its CPU seconds and
   minor page faults, and the 1-minute load average after each round.  A training run repeats
   one plan; a step right after another plan's can be slower than one after its own (save-all of
   a DeepSeek shape by ≈ 1 s of ≈ 3: bench/results/time_fidelity_trace.json), so the timed step
   follows its own plan's.  ``--settle 0`` is the protocol of the records made before.
   Then one profiled step per plan, its executed ops grouped by kind
   (:mod:`tierax.measure.ops`): what each model term is checked against.
3. The calibration again at the end: a drift check, not used.

The record holds per case the predicted step time and its terms, the measured median and
interquartile range over rounds, the error, XLA's cost analysis (FLOPs and bytes; a loop body
counted once) and compiled temp bytes next to the model's fresh bytes and the measured faulted
bytes; per shape both rankings and whether the predicted fastest plan is the measured fastest
wherever their interquartile ranges do not overlap.  ``--quick``: two small shapes, three rounds
(a rehearsal; its numbers are not the record's).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

SCHEMA = "tierax.time-fidelity/1"
PLANS = ("save-all", "minimal", "remat-full", "planner")
SCHEDULE = "lhs"  # no transfers on a CPU: the schedule changes nothing here
VOCAB, LAYERS = 32000, 4


def _shape(family: str, d: int, seq: int, mb: int, dtype: str, **moe) -> dict:
    return {"family": family, "d_model": d, "seq": seq, "microbatch": mb, "dtype": dtype} | moe


# Fixed before the model was changed (issue 25): both families, d_model 256-1024, sequence
# 256-1024, float32 and bfloat16; 4 layers, vocabulary 32000, 1024-2048 tokens per step.
SHAPES = {
    "llama-d256-s1024-f32": _shape("llama", 256, 1024, 2, "float32"),
    "llama-d512-s512-bf16": _shape("llama", 512, 512, 2, "bfloat16"),
    "llama-d768-s256-f32": _shape("llama", 768, 256, 4, "float32"),
    "llama-d1024-s256-bf16": _shape("llama", 1024, 256, 4, "bfloat16"),
    "deepseek-d256-s512-f32": _shape("deepseek", 256, 512, 2, "float32"),
    "deepseek-d512-s256-bf16": _shape("deepseek", 512, 256, 4, "bfloat16"),
    # Added after the record above held (issue 35): DeepSeek-V3's routing shape, many experts and a
    # top-k above 2, at larger widths — not in that record; the default runs all eight since
    # 2026-12-04 (bench/results/time_fidelity.json).
    "deepseek-d768-s512-e16k4-bf16": _shape(
        "deepseek", 768, 512, 2, "bfloat16", num_experts=16, num_experts_per_tok=4
    ),
    "deepseek-d1024-s256-e32k8-f32": _shape(
        "deepseek", 1024, 256, 4, "float32", num_experts=32, num_experts_per_tok=8
    ),
}
DOCS_MARKERS = ("time-fidelity", "time-fidelity-deepseek")
QUICK_SHAPES = {
    "llama-d256-s256-f32": _shape("llama", 256, 256, 2, "float32"),
    "deepseek-d256-s256-bf16": _shape("deepseek", 256, 256, 2, "bfloat16"),
}
CPU_SPECIFIC = {
    "first_touch_s": (
        "CPU-specific: XLA:CPU allocates a step's temporaries anew on each call and the OS "
        "faults each fresh page in on its first write (a GPU allocator keeps its pool: no such "
        "term)"
    ),
    "transpose_s": (
        "CPU-specific: XLA:CPU computes a float32 weight-gradient operand made elementwise in a "
        "fusion writing it transposed, reading its inputs a row apart, slower from a scan's "
        "stacked residuals and slower again with rows a multiple of 4 KiB apart (two calibrated "
        "rates; a GPU transposes in tiles: no such term)"
    ),
    "matmul rate": (
        "CPU-specific calibration: a GEMM mix in the three roles a step runs, the weight "
        "gradient as XLA:CPU lays it out (a GPU: one large square GEMM)"
    ),
    "hbm_s": (
        "not CPU-specific in form (non-matmul bytes / memory bandwidth); the bandwidth is "
        "measured here"
    ),
}


def config(shape: dict):
    from tierax.models.config import DeepSeekConfig, LlamaConfig

    d, name = shape["d_model"], shape["name"]
    if shape["family"] == "llama":
        return LlamaConfig(
            name=name,
            vocab_size=VOCAB,
            d_model=d,
            num_layers=LAYERS,
            num_heads=d // 64,
            num_kv_heads=d // 128,
            head_dim=64,
            mlp_dim=4 * d,
            dtype=shape["dtype"],
        )
    return DeepSeekConfig(
        name=name,
        vocab_size=VOCAB,
        d_model=d,
        num_layers=LAYERS,
        first_dense_layers=1,
        num_heads=d // 64,
        q_lora_rank=d // 2,
        kv_lora_rank=d // 4,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        dense_mlp_dim=4 * d,
        num_experts=shape.get("num_experts", 8),
        num_experts_per_tok=shape.get("num_experts_per_tok", 2),
        num_shared_experts=1,
        expert_mlp_dim=d,
        capacity_factor=1.25,
        dtype=shape["dtype"],
    )


# --------------------------------------------------------------- one shape (its own process)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _inventory(cfg, shape: dict):
    from tierax.tracing import inventory as inv_lib

    return inv_lib.model_inventory(cfg, shape["microbatch"], shape["seq"], {"data": 1, "fsdp": 1})


def _prediction(plan, inv, cfg, rates) -> dict:
    from tierax import costmodel as cm
    from tierax.costmodel.first_touch import fresh_bytes
    from tierax.tracing.model_program import for_inventory

    p = cm.simulate(plan, for_inventory(cfg, inv), rates, SCHEDULE)
    return p.to_json() | {"fresh_bytes": fresh_bytes(p.peak_device_bytes, inv)}


def _plans(cfg, inv, rates) -> tuple[list, dict]:
    """The presets and the planner's plan (within a device budget halfway between remat-full's
    and save-all's predicted peaks), with what the planner was given."""
    from tierax import plan as plan_lib
    from tierax.solving import planner
    from tierax.tracing.model_program import for_inventory

    plans = [plan_lib.preset(n, cfg) for n in PLANS if n != "planner"]
    peak = {p.name: _prediction(p, inv, cfg, rates)["peak_device_bytes"] for p in plans}
    budget = (peak["remat-full"] + peak["save-all"]) / 2
    res = planner.plan(
        for_inventory(cfg, inv), rates, schedule=SCHEDULE, budget_bytes=budget, name="planner"
    )
    return [*plans, res.plan], {"budget_bytes": budget, "placements": res.plan.to_dict()}


def median_entry(entries: list[dict]) -> dict:
    """Per rate, the median over calibration entries (the interleaved calibration)."""
    keys = [k for k, v in entries[0].items() if isinstance(v, float)]
    # the rates by a GEMM's smallest dimension: [[dimension, rate], ...], a median per dimension
    curves = [k for k in entries[0] if k.startswith("matmul_size_rates_")]
    return {
        "created": entries[0]["created"],
        **{k: statistics.median(e[k] for e in entries) for k in keys},
        **{
            k: [
                [dim, statistics.median(e[k][i][1] for e in entries)]
                for i, (dim, _) in enumerate(entries[0][k])
            ]
            for k in curves
        },
    }


def _compiled_info(prepared) -> dict:
    ca = prepared.fn.cost_analysis()
    ca = (ca[0] if isinstance(ca, list) else ca) or {}
    return {
        "compile_s": prepared.compile_s,
        "compiled_memory": prepared.compiled_memory.to_json(),
        "xla_flops_loop_body_once": ca.get("flops"),
        "xla_bytes_accessed_loop_body_once": ca.get("bytes accessed"),
        "loss": float(prepared.metrics["loss"]),
    }


def _timed_step(run: dict, tokens) -> None:
    import resource

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run["prepared"].step(tokens)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    run["wall"].append(wall)
    run["cpu"].append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    run["faults"].append(r1.ru_minflt - r0.ru_minflt)


def op_profile(prepared, tokens) -> dict:
    """One profiled step's executed ops by kind (:func:`tierax.measure.ops.summarize`)."""
    from tierax.measure import ops
    from tierax.measure import profile as profile_lib
    from tierax.measure import trace as trace_lib

    with tempfile.TemporaryDirectory(prefix="tierax-time-fidelity-") as d:
        profile_lib.record(lambda _i: prepared.step(tokens), steps=1, log_dir=d)
        events, _ = trace_lib.load_events(d)
    return ops.summarize(events, ops.classify(prepared.fn.as_text()))


def prepared_steps(cfg, shape: dict, plans) -> tuple:
    """(the shape's synthetic batch on one CPU device, an iterator of (plan, its step compiled and
    warmed up by one step)), compiled one plan at a time as the iterator is read."""
    import jax

    from tierax.measure import harness
    from tierax.mesh import MeshShape
    from tierax.sharding import rules as sh
    from tierax.train import step as step_lib

    mesh = MeshShape(fsdp=1).make()
    opt = step_lib.make_optimizer()
    batch = step_lib.synthetic_batch(cfg, shape["microbatch"], shape["seq"])
    tokens = jax.device_put(batch, sh.batch_sharding(mesh))

    def compiled():
        for p in plans:

            def build(p=p):
                graphdef, state = step_lib.init_state(cfg, opt, mesh=mesh)
                fn = step_lib.make_train_step(graphdef, cfg, p, opt, step_lib.shardings_of(state))
                return fn, state

            yield p, harness.prepare(build, tokens, warmup=1, devices=mesh.devices.flat)

    return tokens, compiled()


def child(spec: dict) -> dict:
    from tierax import costmodel as cm
    from tierax.measure import calibrate
    from tierax.models import config_to_dict

    shape = spec["shape"]
    cfg = config(shape)
    rates = cm.target_rates("cpu", cfg.dtype, calibration={"cpu": spec["calibration"]})
    inv = _inventory(cfg, shape)
    plans, planner_info = _plans(cfg, inv, rates)
    frozen = {p.name: _prediction(p, inv, cfg, rates) for p in plans}
    _say(f"predicted {len(plans)} plans")
    tokens, steps = prepared_steps(cfg, shape, plans)
    runs = []
    for p, prepared in steps:
        runs.append(
            {
                "plan": p,
                "prepared": prepared,
                "info": _compiled_info(prepared),
                "wall": [],
                "cpu": [],
                "faults": [],
            }
        )
        _say(f"compiled {p.name}")
    load, entries = [], []
    for r in range(spec["rounds"]):
        # The calibration's microbenchmarks once per round too: rates measured under the load
        # the steps see (the interleaved calibration; the frozen one is the parent's).
        entries.append(calibrate.measure(repeats=1))
        for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
            for _ in range(spec.get("settle", 0)):  # untimed: the step after a switch of plans
                run["prepared"].step(tokens)
            _timed_step(run, tokens)
        load.append(os.getloadavg()[0])
        _say(f"round {r + 1}/{spec['rounds']} (load {load[-1]:.1f})")
    interleaved = median_entry(entries)
    rates_i = cm.target_rates("cpu", cfg.dtype, calibration={"cpu": interleaved})
    for run in runs if spec.get("profile", True) else []:
        run["info"]["op_profile_one_step"] = op_profile(run["prepared"], tokens)
        _say(f"profiled {run['plan'].name}")
    cases = [
        {
            "plan": run["plan"].name,
            "predicted": frozen[run["plan"].name],
            "predicted_interleaved": _prediction(run["plan"], inv, cfg, rates_i),
            "step_times_s": run["wall"],
            "step_cpu_s": run["cpu"],
            "step_minor_faults": run["faults"],
            **run["info"],
        }
        for run in runs
    ]
    return {
        "shape": shape,
        "model": config_to_dict(cfg),
        "rates": rates.sources,
        "planner": planner_info,
        "load_per_round": load,
        "cases": cases,
        "interleaved_calibration": interleaved,
        "interleaved_entries": [
            {k: v for k, v in e.items() if k != "microbenchmarks"} for e in entries
        ],
        "page_size": os.sysconf("SC_PAGE_SIZE"),
    }


# --------------------------------------------------------------------------------- the parent


def _quartiles(xs: list[float]) -> dict:
    q = statistics.quantiles(sorted(xs), n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {
        "median": statistics.median(xs),
        "q25": q[0],
        "q75": q[2],
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


TERMS = ("compute_s", "hbm_s", "recompute_s", "recompute_hbm_s", "first_touch_s", "transpose_s")


def _ranking(cases: list[dict], key: str) -> dict:
    """Predicted (by ``key``) vs measured order; the fastest-plan check."""
    by_pred = sorted(cases, key=lambda c: c[key])
    by_meas = sorted(cases, key=lambda c: c["measured"]["median"])
    pb, mb = by_pred[0]["measured"], by_meas[0]["measured"]
    overlap = pb["q25"] <= mb["q75"] and mb["q25"] <= pb["q75"]
    return {
        "ranking_predicted": [c["plan"] for c in by_pred],
        "ranking_measured": [c["plan"] for c in by_meas],
        "fastest_predicted": by_pred[0]["plan"],
        "fastest_measured": by_meas[0]["plan"],
        "fastest_iqrs_overlap": overlap,
        "fastest_ok": by_pred[0]["plan"] == by_meas[0]["plan"] or overlap,
    }


def summarise(res: dict) -> dict:
    """Per case: predicted (frozen and interleaved calibration) vs measured; per shape: the
    rankings and the fastest-plan check."""
    cases = []
    for c in res["cases"]:
        m = _quartiles(c["step_times_s"])
        pred, b = c["predicted"]["step_time_s"], c["predicted"]["breakdown"]
        inter = c["predicted_interleaved"]["step_time_s"]
        temp = c["compiled_memory"]["temp"]
        faulted = statistics.median(c["step_minor_faults"]) * res["page_size"]
        cases.append(
            c
            | {
                "measured": m,
                "predicted_step_s": pred,
                "error": pred / m["median"] - 1,
                "predicted_interleaved_step_s": inter,
                "error_interleaved": inter / m["median"] - 1,
                "predicted_terms_s": {k: b.get(k, 0.0) for k in TERMS},
                "median_minor_faults_bytes": faulted,
                "compiled_temp_bytes": temp,
                "fresh_bytes_over_compiled_temp": c["predicted"]["fresh_bytes"] / temp
                if temp
                else None,
            }
        )
    keep = (
        "shape",
        "model",
        "rates",
        "planner",
        "load_per_round",
        "interleaved_calibration",
        "interleaved_entries",
    )
    return (
        {k: res[k] for k in keep}
        | {"cases": cases}
        | _ranking(cases, "predicted_step_s")
        | {"interleaved": _ranking(cases, "predicted_interleaved_step_s")}
    )


def _run_shape(
    name: str, shape: dict, calibration: dict, rounds: int, profile: bool, advance, settle: int
) -> dict:
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        result_path = f.name
    spec = {
        "shape": shape | {"name": name},
        "calibration": calibration,
        "rounds": rounds,
        "settle": settle,
        "profile": profile,
        "result_path": result_path,
    }
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    tail: list[str] = []
    for line in proc.stderr:
        tail = [*tail, line.rstrip()][-40:]
        if line.startswith(("predicted ", "compiled ", "round ", "profiled ")):
            advance(f"{name}: {line.rstrip()}")
    code = proc.wait()
    try:
        text = pathlib.Path(result_path).read_text()
    finally:
        pathlib.Path(result_path).unlink(missing_ok=True)
    if code != 0 or not text:
        raise SystemExit(f"{name}: its process exited {code}:\n" + "\n".join(tail))
    return json.loads(text)


def _calibrate(label: str, advance) -> dict:
    from tierax.measure import calibrate

    load0 = os.getloadavg()[0]
    entry = calibrate.measure(lambda stage: advance(f"calibration ({label}): {stage}"))
    entry["load_before_after"] = [load0, os.getloadavg()[0]]
    return entry


def table(doc: dict) -> str:
    head = f"{'shape':24} {'plan':10} {'frozen s':>8} {'interl. s':>9} {'measured s':>10} "
    lines = [head + f"{'IQR':>15} {'error':>7} {'interl.':>7}"]
    for s in doc["shapes"]:
        for c in s["cases"]:
            m = c["measured"]
            lines.append(
                f"{s['shape']['name']:24} {c['plan']:10} {c['predicted_step_s']:8.3f} "
                f"{c['predicted_interleaved_step_s']:9.3f} {m['median']:10.3f} "
                f"{m['q25']:7.3f}-{m['q75']:<7.3f} {c['error']:+7.1%} "
                f"{c['error_interleaved']:+7.1%}"
            )
        lines.append(
            f"  measured {' < '.join(s['ranking_measured'])}; frozen "
            f"{' < '.join(s['ranking_predicted'])} (fastest ok: {s['fastest_ok']}); "
            f"interleaved fastest ok: {s['interleaved']['fastest_ok']}"
        )
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """The docs' table of a record: per case, both predictions, the measurement, errors."""
    out = [
        (
            "| shape | plan | predicted s (frozen) | predicted s (interleaved) | measured s, "
            "median (IQR) | error frozen | error interleaved | cores the step got |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in doc["shapes"]:
        for c in s["cases"]:
            m = c["measured"]
            out.append(
                f"| {s['shape']['name']} | {c['plan']} | {c['predicted_step_s']:.3f} | "
                f"{c['predicted_interleaved_step_s']:.3f} | {m['median']:.3f} "
                f"({m['q25']:.3f}–{m['q75']:.3f}) | {c['error']:+.1%} | "
                f"{c['error_interleaved']:+.1%} | {cores(c):.2f} |"
            )
    out += [
        "",
        (
            "| shape | measured order | predicted order (frozen) | fastest right (frozen / "
            "interleaved) | load during its rounds |"
        ),
        "|---|---|---|---|---|",
    ]
    for s in doc["shapes"]:
        loads = s["load_per_round"]
        out.append(
            f"| {s['shape']['name']} | {' < '.join(s['ranking_measured'])} | "
            f"{' < '.join(s['ranking_predicted'])} | {_yes(s['fastest_ok'])} / "
            f"{_yes(s['interleaved']['fastest_ok'])} | {min(loads):.1f}–{max(loads):.1f} |"
        )
    summary = doc.get("summary")
    if summary:
        fr, it = summary["frozen"], summary["interleaved"]
        out += [
            "",
            f"Within 15 %: {fr['within_15_percent']} of {summary['cases']} cases (frozen), "
            f"{it['within_15_percent']} (interleaved); median |error| "
            f"{fr['median_abs_error']:.1%} / {it['median_abs_error']:.1%}; fastest plan right "
            f"in {fr['shapes_fastest_ok']} / {it['shapes_fastest_ok']} of {summary['shapes']} "
            "shapes"
            + (
                f"; not run: {', '.join(doc['shapes_not_run'])}"
                if doc.get("shapes_not_run")
                else ""
            )
            + ".",
        ]
    return "\n".join(out)


def cores(case: dict) -> float:
    """Median over rounds of the step's CPU seconds per wall second: the cores it had (two
    on an idle machine of two cores if XLA:CPU kept both busy; less when other processes ran)."""
    return statistics.median(
        cpu / wall for cpu, wall in zip(case["step_cpu_s"], case["step_times_s"], strict=True)
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


METHOD = (
    "predicted: the calibration frozen before the cases (this run's own, measured once at the "
    "start; no per-case parameter); predicted_interleaved: the same model with the same "
    "calibration microbenchmarks run once per round inside each shape's process, medians over "
    "rounds, so that rates and steps see the same load on a shared machine (a per-shape "
    "measurement, reported beside the frozen one, not instead of it); per shape one process: "
    "predictions (tierax.costmodel.simulate, target cpu), every plan compiled and warmed up, "
    "then rounds (the calibration microbenchmarks, then of each plan, order rotating, "
    "settle_steps untimed steps and one timed step), "
    "each step timed alone; measured = median over rounds, IQR = its quartiles; error = "
    "predicted / measured - 1; fastest_ok: the predicted fastest plan is the measured fastest, "
    "or their interquartile ranges overlap; op_profile_one_step: one profiled step's executed "
    "ops by kind (tierax.measure.ops); xla_*_loop_body_once: XLA's cost analysis, which counts a "
    "loop body once"
)


def with_summary(doc: dict, rounds: int, settle: int) -> dict:
    cases = [c for s in doc["shapes"] for c in s["cases"]]
    loads = [x for s in doc["shapes"] for x in s["load_per_round"]]
    load = (
        {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}
        if loads
        else None
    )

    def stats(key: str, shapes_ok: list[bool]) -> dict:
        errors = [abs(c[key]) for c in cases]
        return {
            "within_15_percent": sum(e <= 0.15 for e in errors),
            "max_abs_error": max(errors, default=None),
            "median_abs_error": statistics.median(errors) if errors else None,
            "shapes_fastest_ok": sum(shapes_ok),
        }

    return doc | {
        "rounds": rounds,
        "settle_steps": settle,
        "schedule": SCHEDULE,
        "plans": list(PLANS),
        "cpu_specific_terms": CPU_SPECIFIC,
        "method": METHOD,
        "summary": {
            "cases": len(cases),
            "shapes": len(doc["shapes"]),
            "load_per_round": load,
            "frozen": stats("error", [s["fastest_ok"] for s in doc["shapes"]]),
            "interleaved": stats(
                "error_interleaved", [s["interleaved"]["fastest_ok"] for s in doc["shapes"]]
            ),
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="two small shapes, three rounds (a rehearsal)"
    )
    ap.add_argument(
        "--rounds", type=int, help="interleaved rounds per shape (default 7; --quick 3)"
    )
    ap.add_argument("--shapes", help="comma-separated subset of the shape names")
    ap.add_argument(
        "--settle",
        type=int,
        default=1,
        help="untimed steps of a plan before its timed one in each round (default 1; 0: the "
        "protocol of the records made before 2026-12-02, every timed step right after another "
        "plan's)",
    )
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled step per plan")
    ap.add_argument(
        "--out",
        type=_common.out_path,
        metavar="FILE.json",
        help="output JSON (default bench/results/time_fidelity.json; --quick: "
        "time_fidelity-quick.json)",
    )
    ap.add_argument("--markdown", metavar="RECORD", help="print a record's docs tables")
    ap.add_argument("--docs", metavar="RECORD", help="rewrite the docs' tables from a record")
    ap.add_argument(
        "--marker",
        choices=DOCS_MARKERS,
        default=DOCS_MARKERS[0],
        help="with --docs: which docs table (default %(default)s, the six-shape record's; "
        "time-fidelity-deepseek: the DeepSeek-V3-routing shapes' record)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(pathlib.Path(args.markdown).read_text())))
        return 0
    if args.docs:
        page = _common.write_docs_table(
            args.marker, markdown(json.loads(pathlib.Path(args.docs).read_text()))
        )
        print(f"{page.relative_to(_common.ROOT)}: table rewritten from {args.docs}")
        return 0
    if args.child:
        spec = json.loads(args.child)
        pathlib.Path(spec["result_path"]).write_text(json.dumps(child(spec)))
        return 0
    known = SHAPES | QUICK_SHAPES
    names = [
        s
        for s in (
            args.shapes.split(",") if args.shapes else (QUICK_SHAPES if args.quick else SHAPES)
        )
        if s
    ]
    if bad := [s for s in names if s not in known]:
        raise SystemExit(f"unknown shape(s) {bad}; choose from {', '.join(known)}")
    rounds = args.rounds or (3 if args.quick else 7)
    if args.settle < 0:
        ap.error(f"--settle must be 0 or more, not {args.settle}")
    default = "time_fidelity-quick.json" if args.quick else "time_fidelity.json"
    out = pathlib.Path(args.out or ROOT / "bench" / "results" / default)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from rich.progress import Progress

    from tierax.records import envelope

    write_record = _common.write_record
    command = _common.command_line(argv)
    with Progress() as prog:
        task = prog.add_task("time fidelity", total=2 + len(names) * (len(PLANS) * 2 + rounds + 1))

        def advance(what: str) -> None:
            prog.update(
                task, advance=0.25 if what.startswith("calibration") else 1, description=what
            )

        doc = envelope(SCHEMA, command) | {"load_at_start": os.getloadavg()[0]}
        doc |= {"calibration": _calibrate("before", advance), "shapes": []}
        for name in names:
            res = _run_shape(
                name,
                known[name],
                doc["calibration"],
                rounds,
                not args.no_profile,
                advance,
                args.settle,
            )
            doc["shapes"].append(summarise(res))
            done = [s["shape"]["name"] for s in doc["shapes"]]
            doc["shapes_not_run"] = [n for n in names if n not in done]
            # what an interrupted run measured
            write_record(out, with_summary(doc, rounds, args.settle))
        doc["calibration_after"] = _calibrate("after", advance)
    write_record(out, with_summary(doc, rounds, args.settle))
    print(table(doc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
