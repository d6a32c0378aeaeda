#!/usr/bin/env python3
"""The CPU time model's matmul term checked at the step's own GEMM shapes: every matmul of a
time-fidelity shape's train step, timed alone at its shape beside the calibration's GEMM mix and
the step itself, in one process.

    PYTHONPATH=src python bench/gemm_shapes.py [--shapes NAME,...] [--rounds 5]
        [--out bench/results/gemm_shapes.json]

The model prices a step's matmul FLOPs per dtype at the calibration's rate for each GEMM's
smallest dimension (``Rates.matmul_rate_at``: the GEMM mix of
:func:`tierax.measure.harness.matmul_mix_rate`, two shapes no case has in the three roles a step
runs, and the same roles at smaller dimensions no case has either; records made before
2026-12-04's rates by size priced every GEMM at the mix alone).  Per shape
(``bench/time_fidelity.py``'s SHAPES; default the float32 DeepSeek-V3-routing shape that
time_fidelity_deepseek.json over-predicted on every plan on 2026-12-02, and two float32 shapes
that held in time_fidelity.json as controls) a process of its own:

1. measures what ``tierax calibrate`` measures (the first-touch rate, the GEMM mix, ...);
2. traces the save-all train step's loss and gradients (``jax.make_jaxpr``) and lists every
   ``dot_general`` with its operand shapes, dimension numbers, dtypes and executions per step
   (scan trip counts multiplied in);
3. compiles each distinct GEMM alone — a float32 weight gradient in the form XLA:CPU runs it in
   the step (the calibration's ``weight-gradient`` role: alone, the dot_general as JAX writes it
   gets a faster layout than the step gives it), every other GEMM as ``jax.lax.dot_general`` with
   the step's dimension numbers and dtypes — and times it in ``--rounds``
   rounds that interleave the GEMMs, each call less its own first-touch faults at the measured
   rate (as the calibration does);
4. times the save-all step itself (one warm-up, ``--rounds`` steps).

It records per GEMM its FLOP/s against the mix's, and per shape the step's matmul seconds two ways:
as the model prices them (FLOPs at the rates by smallest dimension, a bfloat16 LM head's at the
calibration's head rate) and the sum of each GEMM's own time × its
executions; then the model's save-all prediction (its other terms unchanged) beside
the same prediction with the matmul seconds at the GEMMs' own shapes, both against the step
measured in the same process.  A GEMM alone is not the GEMM in the step: XLA:CPU may lay out an
operand differently inside the step (the float32 weight gradient's transposed operand is priced
apart, tierax.costmodel.transposes) and independent ops of a step can run at once; the record is a
trace of where the matmul term misses, not a rate for the model.  Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

SCHEMA = "tierax.gemm-shapes/1"
DOCS_MARKER = "gemm-shapes"
DEFAULT_SHAPES = (
    "deepseek-d1024-s256-e32k8-f32",  # over-predicted 11-18 % on every plan (2026-12-02)
    "deepseek-d256-s512-f32",  # held in time_fidelity.json
    "llama-d768-s256-f32",  # held in time_fidelity.json
)
PLAN = "save-all"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def step_gemms(closed_jaxpr) -> list[dict]:
    """Every distinct ``dot_general`` of ``closed_jaxpr`` (nested jaxprs walked, scan trip counts
    multiplied in): operand shapes and dtypes, dimension numbers, the result's dtype, FLOPs per
    execution and executions per step."""
    from tierax.tracing import jaxpr_tools as jt

    found: dict = collections.OrderedDict()
    for eqn, mult, _ in jt._walk(jt._jaxpr(closed_jaxpr), 1, ()):
        if eqn.primitive.name != "dot_general":
            continue
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        a, b = (v.aval for v in eqn.invars[:2])
        key = (
            tuple(a.shape),
            str(a.dtype),
            tuple(b.shape),
            str(b.dtype),
            (tuple(lc), tuple(rc)),
            (tuple(lb), tuple(rb)),
            str(eqn.outvars[0].aval.dtype),
        )
        if key not in found:
            found[key] = {
                "lhs": list(a.shape),
                "lhs_dtype": str(a.dtype),
                "rhs": list(b.shape),
                "rhs_dtype": str(b.dtype),
                "contract": [list(lc), list(rc)],
                "batch": [list(lb), list(rb)],
                "out_dtype": str(eqn.outvars[0].aval.dtype),
                "flops": jt.dot_general_flops(eqn),
                "executions": 0,
            }
        found[key]["executions"] += mult
    return list(found.values())


def weight_gradient_mkn(g: dict) -> tuple[int, int, int] | None:
    """(M, K, N) of a float32 weight gradient as JAX writes it — ``dot_general(x, dy)`` contracting
    the leading (token) dimensions of both, no batch dimensions — else None.  XLA:CPU runs that
    GEMM in a step as an Eigen dot of ``x`` and ``dy`` laid out transposed (the calibration's
    ``weight-gradient`` role, :data:`tierax.measure.harness.MATMUL_ROLES`), where the same
    dot_general alone lets XLA choose a faster layout."""
    (lc, rc), (lb, _) = g["contract"], g["batch"]
    lead = list(range(len(lc)))
    if g["lhs_dtype"] != "float32" or lb or lc != lead or rc != lead:
        return None
    return (
        math.prod(g["lhs"][: len(lc)]),
        math.prod(g["lhs"][len(lc) :]),
        math.prod(g["rhs"][len(rc) :]),
    )


def _gemm_fn(g: dict):
    """(lhs shape, rhs shape, the jitted GEMM, its form) of one of the step's GEMMs, in the form
    XLA:CPU runs it there where that form is known (:func:`weight_gradient_mkn`), else as the
    step writes it."""
    import jax
    import jax.numpy as jnp

    from tierax.measure import harness

    mkn = weight_gradient_mkn(g)
    if mkn is not None:
        a_shape, b_shape, fn = harness.MATMUL_ROLES["weight-gradient"](*mkn, "float32")
        return a_shape, b_shape, jax.jit(fn), "XLA:CPU's weight-gradient form"
    dn = (tuple(map(tuple, g["contract"])), tuple(map(tuple, g["batch"])))
    out = jnp.dtype(g["out_dtype"])
    fn = jax.jit(lambda a, b: jax.lax.dot_general(a, b, dn, preferred_element_type=out))
    return g["lhs"], g["rhs"], fn, "as written"


def time_gemms(gemms: list[dict], rounds: int, touch: float | None) -> None:
    """Each GEMM's median seconds per call (raw, and less each call's first-touch faults at
    ``touch`` bytes/s), rounds interleaving the GEMMs; written into ``gemms``."""
    import jax
    import jax.numpy as jnp

    from tierax.measure import harness

    key = jax.random.key(3)
    runs = []
    for g in gemms:
        a_shape, b_shape, f, g["timed_form"] = _gemm_fn(g)
        a = jax.random.normal(key, a_shape, jnp.float32).astype(g["lhs_dtype"])
        b = jax.random.normal(key, b_shape, jnp.float32).astype(g["rhs_dtype"])
        jax.block_until_ready(f(a, b))
        runs.append((g, f, a, b, [], []))
    for _ in range(rounds):
        for _g, f, a, b, times, faults in runs:
            f0, t0 = harness._minor_faults(), time.perf_counter()
            jax.block_until_ready(f(a, b))
            times.append(time.perf_counter() - t0)
            faults.append(harness._minor_faults() - f0)
    for g, *_, times, faults in runs:
        raw, touched, net = harness._less_first_touch(times, faults, touch)
        g.update(
            times_s=times,
            raw_s=raw,
            net_s=net,
            first_touch_bytes=touched,
            flops_per_s=g["flops"] / net,
        )


def child(spec: dict) -> dict:
    import jax
    import time_fidelity as tf

    from tierax import costmodel as cm
    from tierax import plan as plan_lib
    from tierax.costmodel.first_touch import fresh_bytes
    from tierax.measure import calibrate, harness
    from tierax.mesh import MeshShape
    from tierax.models import config_to_dict
    from tierax.sharding import rules as sh
    from tierax.tracing.model_program import for_inventory
    from tierax.train import step as step_lib

    shape, rounds = spec["shape"], spec["rounds"]
    cfg = tf.config(shape)
    entry = calibrate.measure(repeats=5)  # what `tierax calibrate` measures, in this process
    touch = entry.get("first_touch_bytes_per_s")
    mix = entry["microbenchmarks"][f"matmul_{cfg.dtype}"]
    _say("calibrated")
    plan = plan_lib.preset(PLAN, cfg)
    mesh = MeshShape(fsdp=1).make()
    opt = step_lib.make_optimizer()
    batch = step_lib.synthetic_batch(cfg, shape["microbatch"], shape["seq"])
    tokens = jax.device_put(batch, sh.batch_sharding(mesh))
    graphdef, state = step_lib.init_state(cfg, opt, mesh=mesh)
    loss_fn = step_lib.make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg), None)
    gemms = step_gemms(jax.make_jaxpr(jax.value_and_grad(loss_fn))(state.params, tokens))
    del state
    _say(f"traced {len(gemms)} distinct GEMMs")
    time_gemms(gemms, rounds, touch)
    _say("timed GEMMs")

    def build():
        graphdef, state = step_lib.init_state(cfg, opt, mesh=mesh)
        fn = step_lib.make_train_step(graphdef, cfg, plan, opt, step_lib.shardings_of(state))
        return fn, state

    prepared = harness.prepare(build, tokens, warmup=1, devices=mesh.devices.flat)
    prepared.step(tokens)  # settle: the step after its own (time_fidelity.py's --settle 1)
    steps, faults = [], []
    for _ in range(rounds):
        f0, t0 = harness._minor_faults(), time.perf_counter()
        prepared.step(tokens)
        steps.append(time.perf_counter() - t0)
        faults.append(harness._minor_faults() - f0)
    _say("timed the step")
    del prepared

    calibration = {"cpu": {k: v for k, v in entry.items() if k != "microbenchmarks"}}
    rates = cm.target_rates("cpu", cfg.dtype, calibration=calibration)
    inv = tf._inventory(cfg, shape)
    pred = cm.simulate(plan, for_inventory(cfg, inv), rates, tf.SCHEDULE)
    br = pred.breakdown
    traced_flops = sum(g["flops"] * g["executions"] for g in gemms)
    mix_s = traced_flops / mix["flops_per_s"]
    # What the model prices the GEMMs at: each group's at its rates by smallest dimension, the
    # LM head's at its own where the calibration has one (compute_s holds the matmul seconds and
    # the non-matmul term).
    model_s = br.compute_s - br.hbm_s
    own_s = sum(g["net_s"] * g["executions"] for g in gemms)
    own_raw_s = sum(g["raw_s"] * g["executions"] for g in gemms)
    measured = statistics.median(steps)
    at_shapes = pred.step_time_s - model_s + own_s
    return {
        "shape": shape,
        "model": config_to_dict(cfg),
        "plan": PLAN,
        "mix": {k: mix[k] for k in ("dtype", "flops_per_s", "gemms")},
        "head_matmul_flops_per_s": entry.get(f"head_matmul_flops_per_s_{cfg.dtype}"),
        "first_touch_bytes_per_s": touch,
        "gemms": gemms,
        "step_times_s": steps,
        "step_minor_faults": faults,
        "page_size": os.sysconf("SC_PAGE_SIZE"),
        "measured_step_s": measured,
        "model_executed_flops": br.executed_flops,
        "traced_gemm_flops": traced_flops,
        "matmul_s_at_mix_rate": mix_s,
        "matmul_s_at_own_shapes": own_s,
        "matmul_s_at_own_shapes_raw": own_raw_s,
        "own_over_mix": own_s / mix_s,
        "matmul_s_model": model_s,
        "own_over_model": own_s / model_s,
        "predicted_step_s": pred.step_time_s,
        "predicted_terms_s": {
            k: br[k] for k in ("compute_s", "hbm_s", "first_touch_s", "transpose_s")
        },
        "predicted_fresh_bytes": fresh_bytes(pred.peak_device_bytes, inv),
        "predicted_error": pred.step_time_s / measured - 1,
        "predicted_at_own_shapes_s": at_shapes,
        "predicted_at_own_shapes_error": at_shapes / measured - 1,
        "load_after": os.getloadavg()[0],
    }


def _run(name: str, shape: dict, rounds: int) -> dict:
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        result = pathlib.Path(f.name)
    spec = {"shape": shape | {"name": name}, "rounds": rounds, "result": str(result)}
    path = os.pathsep.join([str(SRC), str(ROOT / "bench")])
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    proc = _common.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env)
    try:
        text = result.read_text()
    finally:
        result.unlink(missing_ok=True)
    if proc.returncode != 0 or not text:
        raise SystemExit(f"{name}: its process exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(text)


def markdown(doc: dict) -> str:
    """The docs' table of a record: per shape, the step's GEMM seconds both ways and the
    save-all prediction both ways against the step measured in the same process."""
    lines = [
        "| shape | model's GEMM s | at own shapes | own / model | measured step s | "
        "predicted (model) | error | predicted (own shapes) | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["shapes"]:
        # records before the head's rate: the model priced every GEMM at the mix's rate
        model_s = r.get("matmul_s_model", r["matmul_s_at_mix_rate"])
        lines.append(
            f"| {r['shape']['name']} | {model_s:.2f} | "
            f"{r['matmul_s_at_own_shapes']:.2f} | {r['matmul_s_at_own_shapes'] / model_s:.2f} | "
            f"{r['measured_step_s']:.2f} | {r['predicted_step_s']:.2f} | "
            f"{r['predicted_error']:+.1%} | {r['predicted_at_own_shapes_s']:.2f} | "
            f"{r['predicted_at_own_shapes_error']:+.1%} |"
        )
    lines += [
        "",
        f"Plan {doc['plan']}, {doc['rounds']} rounds, one process per shape "
        f"(`{doc['command']}`, {doc['created'][:10]}).",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    import time_fidelity as tf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    _common.add_out(ap, "gemm_shapes.json")
    _common.add_docs(ap, SCHEMA)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.docs:
        print(f"wrote {_common.write_docs_table(DOCS_MARKER, markdown(args.docs))}")
        return 0
    if args.child:
        spec = json.loads(args.child)
        pathlib.Path(spec["result"]).write_text(json.dumps(child(spec)))
        return 0
    names = [s for s in args.shapes.split(",") if s]
    unknown = [n for n in names if n not in tf.SHAPES]
    if unknown or not names:
        print(
            f"error: unknown shape(s) {unknown or names}; choose from {sorted(tf.SHAPES)}",
            file=sys.stderr,
        )
        return 2
    if args.rounds < 1:
        print("error: --rounds must be at least 1", file=sys.stderr)
        return 2
    rows = []
    for n in names:
        print(f"{n} ...", file=sys.stderr, flush=True)
        rows.append(_run(n, tf.SHAPES[n], args.rounds))
    doc = _common.envelope(SCHEMA) | {
        "versions": _common.versions("jax", "jaxlib"),
        "plan": PLAN,
        "rounds": args.rounds,
        "shapes": rows,
    }
    _common.write_record(args.out, doc)
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
