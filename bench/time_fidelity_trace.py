#!/usr/bin/env python3
"""Where the CPU time model misses the DeepSeek-family shapes of ``time_fidelity_deepseek.json``:
each plan's step timed and profiled op by op, and the work XLA:CPU does there that the model has
no term for.

    PYTHONPATH=src python bench/time_fidelity_trace.py [--shapes NAME,...] [--rounds 5]
        [--xla-flags FLAGS] [--out bench/results/time_fidelity_trace.json]

Per shape (bench/time_fidelity.py's SHAPES; default its two DeepSeek-V3-routing shapes and, as the
control, the DeepSeek shape that held in time_fidelity.json), a process of its own compiles
save-all, minimal and remat-full (the presets of the fidelity records, whose predictions, made with
a frozen calibration, this script does not repeat), runs
``--rounds`` interleaved rounds of one step each (each step follows another plan's), then
:data:`CONSECUTIVE` steps of each plan back to back (all but the first follow their own plan's, as
in a training run), then profiles one step per plan (each right after its own plan's steps)
(:mod:`tierax.measure.ops`).  It records per plan the measured step times, the op time per kind,
the ``while`` ops' own time (loop bookkeeping, their bodies' ops counted where they belong), the
profiled step's span from its first op to its last and the part of it no op ran in, and
the **stack converts**: fusions that only convert a whole array of rank ≥ 3 and ≥ 16 MiB between
dtypes (a scan's stacked residuals, or a one-layer group's), with their shapes and profiled
seconds.  The profiled seconds of concurrent ops overlap (XLA:CPU runs independent ops at once on
its thread pool), so a kind's seconds are a share of the work, not of the step's wall time: the
record compares plans with each other, and gives each plan's profiled total beside its measured
step.  ``--xla-flags`` runs the same with XLA options of the user's (e.g. one HLO pass disabled), to
see which of XLA:CPU's transformations a cost comes from.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
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

SCHEMA = "tierax.time-fidelity-trace/1"
PLANS = ("save-all", "minimal", "remat-full")
DEFAULT_SHAPES = (
    "deepseek-d768-s512-e16k4-bf16",
    "deepseek-d1024-s256-e32k8-f32",
    "deepseek-d512-s256-bf16",  # held in time_fidelity.json: the control
)
STACK_CONVERT_MIN_BYTES = 16 * 2**20
CONSECUTIVE = 4  # steps of one plan back to back, after the rotating rounds
_CONVERT_ROOT = re.compile(
    r"^\s*%?(?P<name>[\w.\-]+) = (?P<out>\w+\[(?P<dims>[\d,]+)\])\{[^}]*\} "
    r"fusion\((?P<arg>[^)]*)\),.*calls=%?(?P<comp>[\w.\-]+)",
    re.M,
)


def stack_converts(hlo_text: str) -> dict[str, dict]:
    """Fusions whose computation is one parameter converted (``wrapped_convert``-style) into an
    array of rank ≥ 3 and at least :data:`STACK_CONVERT_MIN_BYTES`: name → out shape, bytes."""
    from tierax.measure import ops

    bodies = {}
    for m in re.finditer(r"^%?([\w.\-]+) \([^)]*\) -> [^{]*\{\n(.*?)\n\}", hlo_text, re.M | re.S):
        bodies[m.group(1)] = m.group(2)
    out = {}
    for m in _CONVERT_ROOT.finditer(hlo_text):
        body = bodies.get(m.group("comp"), "")
        lines = [ln for ln in body.splitlines() if ln.strip()]
        if len(lines) != 2 or "parameter(0)" not in lines[0] or " convert(" not in lines[1]:
            continue
        dims = [int(d) for d in m.group("dims").split(",") if d]
        size = ops._nbytes(m.group("out"))
        if len(dims) >= 3 and size >= STACK_CONVERT_MIN_BYTES:
            out[m.group("name")] = {"shape": m.group("out"), "bytes": size}
    return out


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start µs, end µs) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1e6


def _timed_step(prepared, tokens) -> float:
    """Wall seconds of one step (``Prepared.step`` blocks until it is done)."""
    t0 = time.perf_counter()
    prepared.step(tokens)
    return time.perf_counter() - t0


def child(name: str, rounds: int) -> dict:
    import time_fidelity as tf

    from tierax import plan as plan_lib
    from tierax.measure import ops
    from tierax.measure import profile as profile_lib
    from tierax.measure import trace as trace_lib

    shape = tf.SHAPES[name] | {"name": name}
    cfg = tf.config(shape)
    presets = [plan_lib.preset(pn, cfg) for pn in PLANS]
    tokens, steps = tf.prepared_steps(cfg, shape, presets)
    prepared = {p.name: step for p, step in steps}
    times = collections.defaultdict(list)
    for r in range(rounds):
        for pn in PLANS[r % len(PLANS) :] + PLANS[: r % len(PLANS)]:  # the order rotates
            times[pn].append(_timed_step(prepared[pn], tokens))
    # Then each plan's steps back to back (a run trains with one plan): the first follows another
    # plan's step, the rest their own.
    consecutive = {}
    for pn in PLANS:
        consecutive[pn] = [_timed_step(prepared[pn], tokens) for _ in range(CONSECUTIVE)]
    plans = {}
    for pn in PLANS:
        with tempfile.TemporaryDirectory(prefix="tierax-fidelity-trace-") as d:
            profile_lib.record(lambda _i, pn=pn: prepared[pn].step(tokens), steps=1, log_dir=d)
            events, _ = trace_lib.load_events(d)
        text = prepared[pn].fn.as_text()
        classes = ops.classify(text)
        per_op: dict[str, float] = collections.defaultdict(float)
        spans = []
        for e in events:
            op = e.args.get("hlo_op") if hasattr(e, "args") else None
            if op in classes:
                per_op[op] += e.dur_us / 1e6
                if not op.startswith("while"):  # a loop's span covers its body's ops
                    spans.append((e.start_us, e.end_us))
        busy, span = _union_s(spans), (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e6
        kinds: dict[str, float] = collections.defaultdict(float)
        for op, s in per_op.items():
            kinds[classes[op]["category"]] += s
        converts = stack_converts(text)
        plans[pn] = {
            "step_times_s": times[pn],
            "median_s": statistics.median(times[pn]),
            "consecutive_step_times_s": consecutive[pn],
            "consecutive_after_own_median_s": statistics.median(consecutive[pn][1:]),
            "profiled_op_s_by_kind": dict(kinds),
            "profiled_op_s_total": sum(kinds.values()),
            "while_own_s": sum(s for op, s in per_op.items() if op.startswith("while")),
            # wall time from the first op to the last, and the part of it some op (not a loop's
            # own span) was running: the rest is time the step spends between ops
            "profiled_span_s": span,
            "profiled_busy_s": busy,
            "profiled_idle_s": span - busy,
            "stack_converts": {
                op: c | {"profiled_s": per_op.get(op, 0.0)} for op, c in converts.items()
            },
            "stack_converts_profiled_s": sum(per_op.get(op, 0.0) for op in converts),
            "stack_converts_bytes_out": sum(c["bytes"] for c in converts.values()),
            "top_ops": [
                {"op": op, "s": s, "kind": classes[op]["category"], "bytes": classes[op]["bytes"]}
                for op, s in sorted(per_op.items(), key=lambda kv: -kv[1])[:15]
            ],
        }
    return {"shape": shape, "rounds": rounds, "plans": plans}


def main() -> int:
    ap = _common.parser(__doc__, "time_fidelity_trace.json")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated names")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 3)")
    ap.add_argument(
        "--xla-flags",
        default="",
        metavar="FLAGS",
        help="XLA_FLAGS for the shapes' processes (tierax appends its own), e.g. "
        "--xla_disable_hlo_passes=while-loop-invariant-code-motion; recorded",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rounds)))
        return 0
    import time_fidelity as tf

    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in tf.SHAPES]
    if unknown:
        ap.error(f"unknown shape {unknown[0]!r}; choose from: {', '.join(tf.SHAPES)}")
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (a median of fewer says little)")
    shapes = []
    for name in names:
        print(f"{name}: compiling {len(PLANS)} plans, {args.rounds} rounds …", flush=True)
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(SRC)}
        if args.xla_flags:
            env["XLA_FLAGS"] = args.xla_flags
        p = subprocess.run(
            [sys.executable, __file__, "--child", name, "--rounds", str(args.rounds)],
            capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=3600,
        )  # fmt: skip
        if p.returncode != 0:
            sys.exit(f"{name}: the child process failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        shape = json.loads(p.stdout.strip().splitlines()[-1])
        shapes.append(shape)
        for pn, r in shape["plans"].items():
            n, conv = len(r["stack_converts"]), r["stack_converts_profiled_s"]
            print(
                f"  {pn:10s} median {r['median_s']:.2f} s (after its own: "
                f"{r['consecutive_after_own_median_s']:.2f} s); profiled ops "
                f"{r['profiled_op_s_total']:.2f} s; stack converts {n} ({conv:.2f} s); while "
                f"{r['while_own_s']:.2f} s; between ops {r['profiled_idle_s']:.2f} of "
                f"{r['profiled_span_s']:.2f} s",
                flush=True,
            )
    doc = _common.envelope(SCHEMA) | {
        "load_after": os.getloadavg()[0],
        "xla_flags": args.xla_flags,
        "predictions": {
            "deepseek-d768-s512-e16k4-bf16": "bench/results/time_fidelity_deepseek.json",
            "deepseek-d1024-s256-e32k8-f32": "bench/results/time_fidelity_deepseek.json",
            "deepseek-d512-s256-bf16": "bench/results/time_fidelity.json",
        },
        "shapes": shapes,
    }
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
