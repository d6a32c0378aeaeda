#!/usr/bin/env python3
"""One train step, two MLP widths: how much a row stride of a multiple of 4 KiB costs on XLA:CPU.

Question: were the CPU time model's largest misses, its float32 Llama shapes, the MLP widths that
put every SwiGLU gate gradient's rows a multiple of 4 KiB apart?  Answered: yes; the model now
counts transposing reads in two classes by the operand's row stride
(tierax.tracing.hbm.row_aliased) and ``tierax calibrate`` measures each class's rate.
Records: bench/results/row_stride.json
Docs: docs/results/time-model.md

The time-fidelity record's largest misses were its float32 Llama shapes, whose MLP widths (1024,
3072) make every SwiGLU gate gradient's row a multiple of 4 KiB long.  This script runs one of
those shapes (``llama-d256-s1024-f32`` of ``bench/time_fidelity.py``) at its own MLP width and at
a width 16 wider (rows 4160 bytes apart; 1.6 % more MLP FLOPs), every plan, in one process:

* measured: interleaved rounds, one step of each (width, plan) per round, the order rotating;
  median and interquartile range of each;
* profiled: one step each, the seconds of its transposing fusions (``tierax.measure.ops``);
* predicted: ``simulate --target cpu`` with a calibration measured at the start of this run
  (shapes no case uses; no parameter set here).

Reported per plan: the narrower width's step over the wider one's, measured and predicted.

    python bench/investigations/row_stride.py [--rounds 7] [--out bench/results/row_stride.json]
    python bench/investigations/row_stride.py --markdown bench/results/row_stride.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and the benchmarks these read

import _common  # noqa: E402
import time_fidelity as tf  # noqa: E402

SCHEMA = "tierax.row-stride/1"
SHAPE = "llama-d256-s1024-f32"
WIDTHS = (1024, 1040)
PLANS = ("save-all", "minimal", "remat-full")


def _step_s(prepared, tokens) -> float:
    import jax

    t = time.perf_counter()
    prepared.step(tokens)
    jax.block_until_ready(prepared.state)
    return time.perf_counter() - t


def measure(rounds: int) -> dict:
    import jax

    from tierax import costmodel as cm
    from tierax import plan as plan_lib
    from tierax.measure import calibrate, harness
    from tierax.mesh import MeshShape
    from tierax.sharding import rules as sh
    from tierax.tracing.model_program import for_inventory
    from tierax.train import step as step_lib

    calibration = calibrate.measure()
    shape = dict(tf.SHAPES[SHAPE], name=SHAPE)
    mesh = MeshShape(fsdp=1).make()
    opt = step_lib.make_optimizer()
    runs = []
    for width in WIDTHS:
        cfg = dataclasses.replace(tf.config(shape), mlp_dim=width)
        rates = cm.target_rates("cpu", cfg.dtype, calibration={"cpu": calibration})
        inv = tf._inventory(cfg, shape)
        tokens = jax.device_put(
            step_lib.synthetic_batch(cfg, shape["microbatch"], shape["seq"]),
            sh.batch_sharding(mesh),
        )
        for name in PLANS:
            p = plan_lib.preset(name, cfg)

            def build(p=p, cfg=cfg):
                graphdef, state = step_lib.init_state(cfg, opt, mesh=mesh)
                fn = step_lib.make_train_step(graphdef, cfg, p, opt, step_lib.shardings_of(state))
                return fn, state

            pred = cm.simulate(p, for_inventory(cfg, inv), rates, tf.SCHEDULE)
            runs.append(
                {
                    "mlp_dim": width,
                    "plan": name,
                    "row_stride_bytes": width * 4,
                    "predicted_step_s": pred.step_time_s,
                    "predicted_transpose_s": pred.breakdown.transpose_s,
                    "prepared": harness.prepare(build, tokens, warmup=1, devices=mesh.devices.flat),
                    "tokens": tokens,
                    "step_times_s": [],
                }
            )
            print(f"compiled mlp {width} {name}", file=sys.stderr, flush=True)
    load = []
    for r in range(rounds):
        for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
            run["step_times_s"].append(_step_s(run["prepared"], run["tokens"]))
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}/{rounds} (load {load[-1]:.1f})", file=sys.stderr, flush=True)
    for run in runs:
        profile = tf.op_profile(run["prepared"], run["tokens"])
        run["profiled_transposing_s"] = profile.get("transpose", {}).get("s", 0.0)
        run["measured"] = tf._quartiles(run["step_times_s"])
        del run["prepared"], run["tokens"]
    by = {(r["mlp_dim"], r["plan"]): r for r in runs}
    narrow, wide = WIDTHS
    ratios = []
    for name in PLANS:
        a, b = by[narrow, name], by[wide, name]
        ratios.append(
            {
                "plan": name,
                "measured": a["measured"]["median"] / b["measured"]["median"],
                "predicted": a["predicted_step_s"] / b["predicted_step_s"],
            }
        )
    return {
        "shape": shape,
        "calibration": {k: v for k, v in calibration.items() if k != "microbenchmarks"},
        "load_per_round": load,
        "runs": runs,
        "narrow_over_wide": ratios,
    }


def markdown(doc: dict) -> str:
    """The docs' table of a record: per MLP width and plan, measured, predicted, transposes."""
    lines = [
        "| MLP width (row stride) | plan | measured s, median (IQR) | predicted s | error "
        "| transposes: the model's term s · profiled transposing ops s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        m = r["measured"]
        lines.append(
            f"| {r['mlp_dim']} ({r['row_stride_bytes']} B) | {r['plan']} | {m['median']:.3f} "
            f"({m['q25']:.3f}–{m['q75']:.3f}) | {r['predicted_step_s']:.3f} "
            f"| {r['predicted_step_s'] / m['median'] - 1:+.1%} "
            f"| {r['predicted_transpose_s']:.3f} · {r['profiled_transposing_s']:.3f} |"
        )
    ratios = "; ".join(
        f"{r['plan']} {r['measured']:.2f} measured, {r['predicted']:.2f} predicted"
        for r in doc["narrow_over_wide"]
    )
    narrow, wide = (doc["runs"][0]["mlp_dim"], doc["runs"][-1]["mlp_dim"])
    return "\n".join(lines) + f"\n\nStep at width {narrow} over width {wide}: {ratios}.\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--markdown", metavar="RECORD", help="print a record's docs table")
    ap.add_argument("--docs", metavar="RECORD", help="rewrite the docs' table from a record")
    _common.add_out(ap, "row_stride.json")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(pathlib.Path(args.markdown).read_text())))
        return 0
    if args.docs:
        page = _common.write_docs_table(
            "row-stride", markdown(json.loads(pathlib.Path(args.docs).read_text()))
        )
        print(f"{page.relative_to(_common.ROOT)}: table rewritten from {args.docs}")
        return 0
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (an interquartile range needs two steps)")
    from tierax import launch

    launch.start(devices=1)
    doc = _common.envelope(SCHEMA, argv, devices=True)
    doc |= measure(args.rounds)
    doc["method"] = (
        "one process; the calibration first; every (MLP width, plan) compiled and warmed up, then "
        "interleaved rounds of one step each, the order rotating; then one profiled step each "
        "(its transposing ops' seconds); narrow_over_wide: the step at the case's width over the "
        "step 16 wider, measured (medians) and predicted"
    )
    _common.write_record(args.out, doc)
    for r in doc["narrow_over_wide"]:
        print(
            f"{r['plan']:10} {WIDTHS[0]}/{WIDTHS[1]}: measured {r['measured']:.3f}, "
            f"predicted {r['predicted']:.3f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
