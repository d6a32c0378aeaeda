#!/usr/bin/env python3
"""Plans at the compiler's memory limit on the chip: the model's step, what XLA's own program adds
(its rematerialization pass's recompute, loads exposed beyond the model's), and the chip's clock.

Question: does what XLA's compile of a plan adds to the model's step explain the step the chip
measures where the model misses it (the dense microbatch-32 plan with the moments on the host,
whose chip profile spent ~540 ms in XLA's ``.remat`` fusions), and does the plan ``plan --check``
moves to below the limit run faster?  Answered on the v5e chip: the planner's plan's compile holds
about half a second of XLA's own recompute, and the model's step with it is within 4 % of the
chip's (the model alone 15.6 % under); the plan four compiles lower recomputes nearly as much and
ran slower, so ``plan --check`` prices XLA's recompute and does not re-plan on it.
Records: bench/results/chip/recompute_on_chip.json, bench/results/chip/recompute_on_chip_mb47.json
Docs: docs/concepts/mechanisms.md

Each plan is timed by ``tierax bench`` in a child process first (one plan's state on the device at
a time), then compiled in this process for v5e by ``tierax.xla.compile.compile_for_target`` — on
the attached chip where there is one (the program that ran), else deviceless — and predicted by
``tierax simulate``'s model at the v5e rates (no calibration).  ``compiled_step_s`` is
:func:`tierax.xla.recompute.compiled_step_s` of the same figures: the model's step
plus XLA's own recompute plus the loads the replay exposes beyond the model's (the streamed
update's included).

    python bench/investigations/recompute_on_chip.py --microbatch 32 \\
        --plans bench/results/chip/plans/planned_state_mb32.yaml,... --out FILE.json
    python bench/investigations/recompute_on_chip.py --tiny --out /tmp/r.json   # CPU rehearsal
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and tpu_check's case shapes

import _common  # noqa: E402

# toy sizes of the dense case for the CPU rehearsal
TINY = ["d_model=128", "num_layers=2", "mlp_dim=256", "num_heads=4", "num_kv_heads=2",
        "head_dim=32", "vocab_size=512", "dtype=bfloat16", "attention=auto"]  # fmt: skip


def pct(e: float | None) -> str:
    return "—" if e is None else f"{e:+.1%}"


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "chip/recompute_on_chip.json")
    ap.add_argument("--microbatch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--plans", default="bench/results/chip/plans/planned_state_mb32.yaml",
                    help="plan files or presets, comma-separated")  # fmt: skip
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (a rehearsal)")
    args = ap.parse_args(argv)
    import tpu_check

    sets = TINY if args.tiny else next(c for c in tpu_check.CASES if c[0] == "dense")[2]
    mb, seq = (2, 128) if args.tiny else (args.microbatch, args.seq)
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    model = ["--model", "tiny-llama", *[a for kv in sets for a in ("--set", kv)]]
    doc = _common.envelope("tierax.recompute-on-chip/1", argv)
    # the chip's clock first, in a child (this process then starts JAX for the compiles)
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "bench.json"
        bench = _common.tierax(
            "bench", *model, "--microbatch", str(mb), "--seq", str(seq), "--plans",
            ",".join(plans), "--steps", str(args.steps), "--out", str(out),
        )  # fmt: skip
        r = _common.run(bench, timeout=540)
        print(r.stdout[-3000:], r.stderr[-2000:] if r.returncode else "", flush=True)
        if r.returncode:
            raise SystemExit(f"bench failed (exit {r.returncode})")
        measured = json.loads(out.read_text())
    doc["bench"] = {k: measured[k] for k in ("command", "machine", "jax_version")}

    from tierax import launch

    attached = launch.start_tpu_compile("none", "v5litepod-1")
    from tierax import costmodel as cm
    from tierax.models import apply_overrides, for_platform, get_config
    from tierax.plan.presets import load_plan
    from tierax.tracing.model_program import program_of
    from tierax.xla.compile import compile_for_target
    from tierax.xla.recompute import compiled_step_s

    cfg = for_platform(apply_overrides(get_config("tiny-llama"), sets), "tpu")
    rates = cm.target_rates("v5e", cfg.dtype, calibration={})
    prog = program_of(cfg, mb, seq, {"data": 1, "fsdp": 1})
    doc["attached"] = attached
    doc["rows"] = []
    by_name = {rec["plan"]: rec for rec in measured["records"]}
    not_run = {n["plan"]: n for n in measured.get("not_run", [])}
    for spec in plans:
        plan = load_plan(spec, cfg)
        rec = by_name.get(plan.name) or {"plan": plan.name, "error": not_run.get(plan.name)}
        res, _ = compile_for_target(cfg, plan, "v5e", microbatch=mb, seq=seq)
        pred = cm.simulate(plan, prog, rates, "lhs")
        b = pred.breakdown
        model_loads = b.exposed_loads_s
        replay_loads = res.overlap.get("by_direction", {}).get("h2d", {}).get("est_exposed_s", 0)
        recompute = res.xla_recompute.get("est_s", 0.0)
        compiled_step = compiled_step_s(pred.step_time_s, recompute, replay_loads - model_loads)
        step = rec.get("step_time_s")
        row = {
            "plan": spec,
            "plan_name": rec["plan"],
            "compiled_on": res.compiled_on or "deviceless",
            "libtpu": res.libtpu_version,
            "xla_peak_bytes": res.device_peak_bytes,
            "predicted_peak_bytes": pred.peak_device_bytes,
            "xla_recompute": res.xla_recompute,
            "model_load_exposed_s": model_loads,
            "replay_load_exposed_s": replay_loads,
            "predicted_step_s": pred.step_time_s,
            "compiled_step_s": compiled_step,
            "measured_step_s": step,
            "error": None if not step else pred.step_time_s / step - 1,
            "compiled_error": None if not step else compiled_step / step - 1,
            "ran": bool(step),
            "bench_error": rec.get("error"),
        }
        doc["rows"].append(row)
        print(
            f"{spec}: chip {step * 1e3 if step else float('nan'):.1f} ms · model "
            f"{pred.step_time_s * 1e3:.1f} ({pct(row['error'])}) · XLA's recompute "
            f"{recompute * 1e3:.1f} ms, loads {replay_loads * 1e3:.1f} vs model "
            f"{model_loads * 1e3:.1f} -> {compiled_step * 1e3:.1f} ms "
            f"({pct(row['compiled_error'])})",
            flush=True,
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
