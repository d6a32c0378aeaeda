#!/usr/bin/env python3
"""XLA:CPU's transposing fusion in two forms: a plain top-level one and the train step's.

Question: does the plain top-level transposing fusion that ``tierax calibrate`` once timed price
the train step's form of it (inside the backward loop, reading residuals sliced from the scan's
stacks)?  Answered: no; the step's form is slower per element and feels the row stride more, so
calibrate now times the loop's form (tierax.measure.harness.transposed_fusion_rate).
Records: bench/results/transpose_forms.json
Docs: docs/results/time-model.md

``tierax calibrate`` once priced the CPU-only transposing-fusion term with the plain form: a
fusion ``((a·b)·(1 − c) + c)ᵀ`` of three float32 arrays at the top level of a program (it now
times the backward loop's form per row-stride class, ``tierax.measure.harness.
transposed_fusion_rate``; this record is part of what moved it).  In the train step the same
kind of fusion is the SwiGLU gate's backward written transposed for a dense layer's weight
gradient, inside the backward loop, reading residuals sliced from the scan's stacks.  This script
times both forms
side by side at several ``[tokens, hidden]`` shapes, in one process on this machine:

* ``calibration``: the plain top-level fusion at ``[tokens, hidden]`` (median of repeats);
* ``step``: a 4-layer backward loop (``lax.scan``) that per layer takes the VJP of
  ``tierax.models.layers.swiglu_gate`` and of ``x @ w`` for both up-projections (as ``nnx.Linear``
  writes them), with ``g``, ``u`` and ``x`` sliced from stacked arrays; the transposing fusions'
  own seconds from a profiled run (``tierax.measure.ops`` categories), per fusion and layer.

Reported per shape: nanoseconds per output element of each form, their ratio, and the input row
stride in bytes (hidden × 4) with whether it is a multiple of 4 KiB.  No time-model parameter is
set from it; it is the measurement behind the time-fidelity record's open misses.

    python bench/investigations/transpose_forms.py [--out bench/results/transpose_forms.json]
"""

from __future__ import annotations

import collections
import pathlib
import statistics
import sys
import tempfile
import time

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: _common and the benchmarks these read

import _common  # noqa: E402

SCHEMA = "tierax.transpose-forms/1"
LAYERS = 4
BATCH = 2
D_MODEL = 256
# (sequence, hidden): tokens = BATCH × sequence; hidden strides of 4, 5, 6, 8, 10 and 12 KiB
SHAPES = [(1024, 1024), (768, 1280), (768, 1536), (768, 2048), (768, 2560), (768, 3072)]


def _median_s(fn, *args, repeats: int = 7) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def calibration_form(tokens: int, hidden: int) -> float:
    """Seconds of the calibration's fusion at ``[tokens, hidden]``."""
    import jax
    import jax.numpy as jnp

    keys = range(3)
    a, b, c = (jax.random.normal(jax.random.key(i), (tokens, hidden), jnp.float32) for i in keys)
    f = jax.jit(lambda a, b, c: ((a * b) * (1 - c) + c).T)
    return _median_s(f, a, b, c)


def step_form(seq: int, hidden: int) -> dict:
    """The backward loop's transposing fusions: seconds per fusion and layer, and their shapes."""
    import jax
    import jax.numpy as jnp

    from tierax.measure import ops
    from tierax.measure import profile as profile_lib
    from tierax.measure import trace as trace_lib
    from tierax.models.layers import swiglu_gate

    k = jax.random.split(jax.random.key(0), 6)
    g = jax.random.normal(k[0], (LAYERS, BATCH, seq, hidden))
    u = jax.random.normal(k[1], (LAYERS, BATCH, seq, hidden))
    x = jax.random.normal(k[2], (LAYERS, BATCH, seq, D_MODEL))
    dy = jax.random.normal(k[3], (BATCH, seq, D_MODEL))
    wo = jax.random.normal(k[4], (LAYERS, hidden, D_MODEL)) * 0.02
    wi = jax.random.normal(k[5], (LAYERS, D_MODEL, hidden)) * 0.02

    def backward(g, u, x, dy, wo, wi):
        def body(carry, i):
            _, gate_vjp = jax.vjp(swiglu_gate, g[i], u[i])
            dg, du = gate_vjp(jnp.einsum("bsd,fd->bsf", dy, wo[i]))
            dense_vjp = jax.vjp(lambda w: x[i] @ w, wi[i])[1]
            return carry, (dense_vjp(dg)[0], dense_vjp(du)[0])

        return jax.lax.scan(body, 0.0, jnp.arange(LAYERS)[::-1])

    f = jax.jit(backward)
    args = (g, u, x, dy, wo, wi)
    total = _median_s(f, *args)
    kinds = ops.classify(f.lower(*args).compile().as_text())
    with tempfile.TemporaryDirectory(prefix="tierax-transpose-forms-") as d:
        profile_lib.record(lambda _i: jax.block_until_ready(f(*args)), steps=1, log_dir=d)
        events, _ = trace_lib.load_events(d)
    per_op: dict = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        name = e.args.get("hlo_op") if hasattr(e, "args") else None
        if name in kinds and kinds[name]["category"] == "transpose":
            per_op[name][0] += e.dur_us / 1e6
            per_op[name][1] += 1
    # the two gate-gradient fusions: the transposing fusions executed once per layer, largest
    big = sorted(((s, n) for n, (s, c) in per_op.items() if c == LAYERS), reverse=True)[:2]
    return {
        "step_s": total,
        "fusions": [{"op": n, "seconds_per_layer": s / LAYERS} for s, n in big],
        "all_transposing_s": sum(s for s, _ in per_op.values()),
    }


def measure(shapes=SHAPES) -> list[dict]:
    rows = []
    for seq, hidden in shapes:
        tokens = BATCH * seq
        cal = calibration_form(tokens, hidden)
        step = step_form(seq, hidden)
        if len(step["fusions"]) < 2:
            raise SystemExit(f"seq {seq} hidden {hidden}: no pair of per-layer transposing fusions")
        per_fusion = statistics.fmean(f["seconds_per_layer"] for f in step["fusions"])
        elems = tokens * hidden
        rows.append(
            {
                "tokens": tokens,
                "hidden": hidden,
                "row_stride_bytes": hidden * 4,
                "stride_multiple_of_4KiB": (hidden * 4) % 4096 == 0,
                "calibration_ns_per_element": cal / elems * 1e9,
                "step_ns_per_element": per_fusion / elems * 1e9,
                "step_over_calibration": per_fusion / cal,
                "step": step,
            }
        )
        r = rows[-1]
        print(
            f"[{tokens}, {hidden}] stride {hidden * 4} B: calibration "
            f"{r['calibration_ns_per_element']:.2f} ns/elem, step "
            f"{r['step_ns_per_element']:.2f} ns/elem ({r['step_over_calibration']:.1f}x)",
            flush=True,
        )
    return rows


def main(argv=None) -> int:
    ap = _common.parser(__doc__, "transpose_forms.json")
    args = ap.parse_args(argv)
    from tierax import launch

    launch.start(devices=1)
    doc = _common.envelope(SCHEMA, argv, devices=True)
    rows = measure()
    doc |= {
        "layers": LAYERS,
        "batch": BATCH,
        "d_model": D_MODEL,
        "rows": rows,
        "method": "one process, shapes in turn; calibration form: median of 7 calls of the "
        "jitted fusion; step form: the median call of the jitted 4-layer backward loop, and the "
        "two per-layer transposing fusions' own seconds from one profiled call (tierax.measure.ops "
        "categories), averaged; per output element [tokens × hidden]",
    }
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
