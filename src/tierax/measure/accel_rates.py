"""Kernel rates on an accelerator as a training step sees them: GEMMs by shape, the splash attention
kernel, and the host link through the step's own offload path.

A TPU or GPU runs a small kernel in less time than Python takes to dispatch it, so one blocking
call per kernel measures the dispatch, not the kernel (a 1024³ matmul "ran" at 3–4 TFLOP/s on a
TPU v5e that multiplies bf16 at ~190: ``bench/results/tpu_probe.json``).  Here every kernel is
called ``calls`` times back to back and blocked on once, so the device runs them one after another
while Python queues the next; the best of ``rounds`` such bursts is the kernel's time.

``tierax calibrate`` stores these rates under the target key (``v5e`` on a TPU v5e); ``simulate``
and ``plan`` read them in place of the datasheet figures (their sources say which are measured).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

# The step-like GEMM mix: tokens × width → width, 4·width and back, for a 2k-wide model at 16k
# tokens (microbatch 8 × seq 2048); smallest dimension 2048.
STEP_GEMMS = ((16384, 2048, 2048), (16384, 2048, 8192), (16384, 8192, 2048))
# The rate by a GEMM's smallest dimension (Rates.matmul_size_rates): (M, d, WIDE) and (M, WIDE, d)
# for each d (a head dim's, a kv projection's, an expert's small token count), the mix above as the
# largest point.
SIZE_DIMS = (128, 256, 512, 1024)
SIZE_M, SIZE_WIDE = 16384, 8192
# The splash kernel by sequence length and head dim (query heads 16 over 8 kv heads, the check's
# dense model), tokens per call ~16k where the sequence allows.
SPLASH_CASES = ((2048, 128), (4096, 128), (8192, 128), (2048, 64), (8192, 64))
SPLASH_TOKENS = 16384
# The host link through the step's offload path (tierax.models.prefetch): layers × tokens × width
# bf16 values, one offloaded per layer (64 MiB each at the default).
LINK_LAYERS, LINK_TOKENS, LINK_WIDTH = 8, 8192, 4096
# The host link beside compute (link_beside_compute): layers of MATMULS [tokens, width]² products,
# each storing a value of each size in MiB; the smallest size of the chip's shape was hidden under
# its layers' compute (bench/results/chip/link_beside_compute.json), so calibrate starts above it.
BESIDE = {"layers": 8, "tokens": 8192, "width": 2048, "matmuls": 8, "sizes_mib": (128, 256)}
BESIDE_TINY = {"layers": 4, "tokens": 256, "width": 128, "matmuls": 2, "sizes_mib": (0.25, 0.5)}

_ROLES = {
    # y = x·W, dx = dy·Wᵀ, dW = xᵀ·dy: the three GEMMs a step runs for one weight.
    "forward": (lambda m, k, n: ((m, k), (k, n)), (((1,), (0,)), ((), ()))),
    "input-gradient": (lambda m, k, n: ((m, n), (k, n)), (((1,), (1,)), ((), ()))),
    "weight-gradient": (lambda m, k, n: ((m, k), (m, n)), (((0,), (0,)), ((), ()))),
}


def back_to_back(fn: Callable, args: tuple, calls: int = 10, rounds: int = 3) -> float:
    """Seconds per call of ``fn(*args)``: the best of ``rounds`` bursts of ``calls`` calls issued
    back to back and blocked on once (after one warm-up call)."""
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(rounds):
        t = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def _calls_for(flops: float) -> int:
    # ~20 ms of work a burst at 200 TFLOP/s, between 5 and 200 calls.
    return int(min(200, max(5, 4e12 / max(flops, 1.0))))


def gemm_rates(shapes: Sequence[tuple[int, int, int]], dtype: str = "bfloat16") -> dict:
    """Each shape (M, K, N) in the three roles of :data:`_ROLES`, random operands of ``dtype``:
    ``{"flops_per_s": summed FLOPs over summed seconds, "gemms": [...]}``."""
    key = jax.random.key(7)
    gemms, flops, secs = [], 0.0, 0.0
    for m, k, n in shapes:
        for role, (operand_shapes, dims) in _ROLES.items():
            a_shape, b_shape = operand_shapes(m, k, n)
            ka, kb = jax.random.split(key)
            a = jax.random.normal(ka, a_shape, jnp.float32).astype(dtype)
            b = jax.random.normal(kb, b_shape, jnp.float32).astype(dtype)
            f = jax.jit(lambda x, y, dims=dims: jax.lax.dot_general(x, y, dims))
            work = 2.0 * m * k * n
            t = back_to_back(f, (a, b), _calls_for(work))
            flops, secs = flops + work, secs + t
            gemms.append({"shape": [m, k, n], "role": role, "s": t, "flops_per_s": work / t})
            del a, b
    return {"dtype": jnp.dtype(dtype).name, "flops_per_s": flops / secs, "gemms": gemms}


def gemm_size_rates(dtype: str = "bfloat16", mix: dict | None = None) -> dict:
    """The GEMM rate by smallest dimension: ``points`` [[d, FLOP/s], ...] ascending, the step-like
    mix (``mix``, else measured here) as the largest point; ``runs``: each point's GEMMs."""
    mix = mix or gemm_rates(STEP_GEMMS, dtype)
    points, runs = [], {}
    for d in SIZE_DIMS:
        r = gemm_rates(((SIZE_M, d, SIZE_WIDE), (SIZE_M, SIZE_WIDE, d)), dtype)
        points.append([d, r["flops_per_s"]])
        runs[str(d)] = r
    top = min(min(s) for s in STEP_GEMMS)
    return {"points": points + [[top, mix["flops_per_s"]]], "runs": runs}


def _stand_in_flops(q, k, v) -> float:
    """The forward matmul FLOPs the cost model counts for one splash call: its XLA stand-in's
    (``splash_blockwise``) matmuls inside the fused scope, as the inventory traces them."""
    from tierax.models import attention
    from tierax.tracing import jaxpr_tools

    closed = jax.make_jaxpr(
        lambda q, k, v: attention.causal_attention(q, k, v, impl="splash_blockwise")
    )(q, k, v)
    return float(jaxpr_tools.matmul_flops(closed, scope=attention.FUSED_SCOPE))


# The splash kernels' own ops in a device trace: the forward's, and the backward's two.
SPLASH_FWD_OPS, SPLASH_BWD_OPS = ("splash_mha_fwd",), ("splash_mha_dq", "splash_mha_dkv")


def device_op_seconds(fn: Callable, args: tuple, calls: int, prefixes: tuple[str, ...]) -> float:
    """Seconds per call the device spends in the ops whose names start with one of ``prefixes``:
    ``calls`` calls of ``fn(*args)`` traced (:func:`tierax.measure.profile.record`), the device's
    "XLA Ops" summed (0.0 where the trace has no device ops: XLA:CPU)."""
    import tempfile

    from tierax.measure.profile import record
    from tierax.measure.trace import is_device_process, load_events

    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory(prefix="tierax-ops-") as where:
        record(lambda _: jax.block_until_ready(fn(*args)), steps=calls, log_dir=where)
        events, _ = load_events(where)
    us = sum(
        e.dur_us
        for e in events
        if is_device_process(e.process) and e.thread == "XLA Ops" and e.name.startswith(prefixes)
    )
    return us / 1e6 / calls


def splash_rates(
    cases: Sequence[tuple[int, int]] = SPLASH_CASES,
    *,
    tokens: int = SPLASH_TOKENS,
    kv_heads: int = 8,
    groups: int = 2,
    interpret: bool = False,
    profile_calls: int = 0,
) -> list:
    """The splash kernel's forward and backward FLOP/s for each (seq, head dim): the forward's
    FLOPs as the cost model counts them (:func:`_stand_in_flops`), the backward's 2.5 × those
    over (forward + backward) less forward seconds.  ``interpret``: Pallas's interpreter (a CPU
    rehearsal; its times mean nothing).  ``profile_calls``: also the kernels alone, from that many
    traced calls (:func:`device_op_seconds`: the forward kernel, and the backward's dq and dkv
    kernels), without the wrapper's XLA ops around them (``kernel_*`` keys; None where the trace
    holds no kernel)."""
    from tierax.costmodel.rates import FUSED_BACKWARD_FLOPS_RATIO
    from tierax.models import attention

    out = []
    for seq, d in cases:
        batch, kv = max(1, tokens // seq), kv_heads
        ks = jax.random.split(jax.random.key(3), 3)
        q = jax.random.normal(ks[0], (batch, seq, kv, groups, d), jnp.bfloat16)
        k = jax.random.normal(ks[1], (batch, seq, kv, d), jnp.bfloat16)
        v = jax.random.normal(ks[2], (batch, seq, kv, d), jnp.bfloat16)

        def fwd(q, k, v):
            return attention.splash_attention(q, k, v, interpret=interpret)

        def loss(q, k, v):
            return jnp.sum(fwd(q, k, v).astype(jnp.float32))

        flops = _stand_in_flops(q, k, v)
        calls = 2 if interpret else _calls_for(3.5 * flops)
        f_fwd, f_fb = jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        t_f = back_to_back(f_fwd, (q, k, v), calls)
        t_fb = back_to_back(f_fb, (q, k, v), calls)
        bwd_s = max(t_fb - t_f, 1e-9)
        alone = {}
        if profile_calls:
            k_f = device_op_seconds(f_fwd, (q, k, v), profile_calls, SPLASH_FWD_OPS)
            k_b = device_op_seconds(f_fb, (q, k, v), profile_calls, SPLASH_BWD_OPS)
            alone = {
                "kernel_forward_s": k_f or None,
                "kernel_backward_s": k_b or None,
                "kernel_fwd_flops_per_s": flops / k_f if k_f else None,
                "kernel_bwd_flops_per_s": FUSED_BACKWARD_FLOPS_RATIO * flops / k_b if k_b else None,
            }
        out.append(
            {
                "seq": seq,
                "head_dim": d,
                "batch": batch,
                "heads": kv * groups,
                "kv_heads": kv,
                "forward_flops": flops,
                "forward_s": t_f,
                "forward_backward_s": t_fb,
                "fwd_flops_per_s": flops / t_f,
                "bwd_flops_per_s": FUSED_BACKWARD_FLOPS_RATIO * flops / bwd_s,
                **alone,
            }
        )
    return out


def nearest_splash(table: Sequence[dict], seq: int, head_dim: int) -> dict:
    """The measured splash case closest to ``seq`` and ``head_dim`` (log distance, head dim
    first)."""
    return min(
        table,
        key=lambda r: (
            abs(math.log2(r["head_dim"] / head_dim)),
            abs(math.log2(r["seq"] / seq)),
        ),
    )


# Gathers and scatters as an MoE layer's routing runs them (tierax.models.moe at 16k tokens, top-2
# of 8 experts): element lookups of 65,536 indices into a 32,768-long vector, and bf16 rows of 1024
# scatter-added by index — as many rows into a buffer 4 × larger (a dispatch) and 4 × as many
# into one as large as the rows' tokens (a combine's gradient).
INDEX_LOOKUPS, INDEX_SOURCE = 65536, 32768
SCATTER_CASES = ((16384, 65536), (65536, 16384))  # (update rows, buffer rows)
SCATTER_WIDTH = 1024


def indexed_rates(calls: int = 20) -> dict:
    """XLA's gathers and scatters as a step runs them: the seconds per index of an element gather
    (its bytes negligible), and the bytes per second a row scatter-add writes its updates at once
    its indices' cost (the gather's per index) is taken out — over the scatter cases together.
    :func:`tierax.costmodel.rates.indexed_s` prices a step's gathers and scatters with them
    (:func:`tierax.tracing.hbm.phase_indexed` counts them)."""
    k = jax.random.split(jax.random.key(7), 3)
    src = jax.random.randint(k[0], (INDEX_SOURCE,), 0, 1 << 20, jnp.int32)
    idx = jax.random.randint(k[1], (INDEX_LOOKUPS,), 0, INDEX_SOURCE, jnp.int32)
    gather_s = back_to_back(jax.jit(lambda s, i: s[i]), (src, idx), calls)
    per_index = gather_s / INDEX_LOOKUPS
    runs, total_bytes, total_s = [], 0.0, 0.0
    for rows, out_rows in SCATTER_CASES:
        upd = jax.random.normal(k[2], (rows, SCATTER_WIDTH), jnp.bfloat16)
        at = jax.random.randint(k[1], (rows,), 0, out_rows, jnp.int32)

        def scatter(u, i, out_rows=out_rows):
            return jnp.zeros((out_rows, SCATTER_WIDTH), u.dtype).at[i].add(u)

        t = back_to_back(jax.jit(scatter), (upd, at), calls)
        nbytes = rows * SCATTER_WIDTH * 2
        runs.append({"update_rows": rows, "buffer_rows": out_rows, "width": SCATTER_WIDTH, "s": t})
        total_bytes += nbytes
        total_s += max(t - rows * per_index, 1e-12)
    return {
        "gather": {"indices": INDEX_LOOKUPS, "source": INDEX_SOURCE, "s": gather_s},
        "scatters": runs,
        "index_op_s": per_index,
        "scatter_bytes_per_s": total_bytes / total_s,
    }


def _link_layer(x, w):
    from tierax.models.tags import tag

    r = tag(x * w[None, :], "link_r")  # the offloaded value
    s = tag(r[:8, :128] * 2, "link_s")  # a tiny one: the baseline's offload
    return jnp.sin(r) + jnp.sum(s) * 0


def step_link_rates(
    layers: int = LINK_LAYERS, tokens: int = LINK_TOKENS, width: int = LINK_WIDTH, calls: int = 3
) -> dict:
    """The host link as the step's own copies see it: tierax's prefetching layer scan
    (:func:`tierax.models.prefetch.prefetch_scan`, the default offload mechanism) over ``layers``
    cheap layers, forward and backward, each layer storing one [tokens, width] bf16 value in host
    memory in the forward and loading it in the backward, against the same scan keeping that value
    on the device (both offload a tiny value, so the programs differ only in where the large one
    lives).  Little compute runs beside the copies, so the difference is the copies' own time: the
    round trip's bytes (each way's, twice) over it is the rate, given to both directions (the
    step's stores and loads run in different passes, so only their sum is seen).

    Not the forward alone with its residuals returned: a jitted program that returns host-memory
    outputs moves them by a slower path than the step's own stores (on the v5e chip 0.9 GB/s
    against a round trip at ~15: bench/results/chip/tpu_check_first.json).  On XLA:CPU offloading
    is a no-op: the figures there are noise around zero."""
    from tierax.models.prefetch import prefetch_scan

    run_off = prefetch_scan(_link_layer, keep=("link_s",), offload=("link_r",))
    run_keep = prefetch_scan(_link_layer, keep=("link_r",), offload=("link_s",))
    ks = jax.random.split(jax.random.key(5), 2)
    x0 = jax.random.normal(ks[0], (tokens, width), jnp.bfloat16)
    w = (1.0 + 0.01 * jax.random.normal(ks[1], (layers, width), jnp.float32)).astype(jnp.bfloat16)

    def both(run):
        return jax.jit(jax.grad(lambda x0, w: jnp.sum(run(x0, w).astype(jnp.float32)), (0, 1)))

    t = {
        f"step_{name}_s": back_to_back(both(run), (x0, w), calls)
        for name, run in (("offload", run_off), ("keep", run_keep))
    }
    nbytes = layers * tokens * width * 2
    copy_s = t["step_offload_s"] - t["step_keep_s"]
    rate = 2 * nbytes / copy_s if copy_s > 0 else None
    return {
        "layers": layers,
        "bytes_each_way": nbytes,
        **t,
        "round_trip_s": copy_s,
        "d2h_bytes_per_s": rate,
        "h2d_bytes_per_s": rate,
        "note": "one rate for both directions: the round trip's bytes over its time",
        "loads_alone": host_loads_alone(layers, tokens, width, calls),
    }


def _attention_step(h, seq: int, head_dim: int, interpret: bool):
    """Causal splash attention over [tokens, width] read as [tokens / seq, seq] sequences of
    width / head_dim query heads over half as many kv heads (each kv head its group's first
    query head): the kernel a step's attention runs, its backward included."""
    from tierax.models import attention

    t, w = h.shape
    q = h.reshape(t // seq, seq, w // head_dim // 2, 2, head_dim)
    kv = q[:, :, :, 0]
    return attention.splash_attention(q, kv, kv, interpret=interpret).reshape(t, w)


def beside_compute_layer(
    matmuls: int,
    values: int,
    wide: int,
    width: int,
    minor: int = 0,
    attention: tuple[int, int, bool] | None = None,
) -> Callable:
    """One layer of :func:`link_beside_compute`: ``matmuls`` [tokens, width] × [width, width]
    products (``attention`` (seq, head dim, interpret): as many splash attention calls instead,
    :func:`_attention_step`), then ``values`` tagged values of [tokens, wide] made from the result
    (what the plan offloads or keeps; with ``minor``, shaped [tokens, wide / minor, minor], as a
    head dim of that width holds it) and read back into the carry; a tiny tagged value the other
    program offloads."""
    from tierax.models.tags import tag

    reps = wide // width

    def layer(x, p):
        h = x
        for _ in range(matmuls):
            h = _attention_step(h, *attention) if attention else jnp.tanh(h @ p["mm"])
        out = h
        for j in range(values):
            r = jnp.tile(h, (1, reps)) * p["scale"][j][None, :]
            if minor:
                r = r.reshape(h.shape[0], wide // minor, minor)
            r = tag(r, f"link_r{j}")
            out = out + jnp.sin(r).reshape(h.shape[0], reps, width).sum(1)
        s = tag(out[:8, :128] * 2, "link_s")
        return out + jnp.sum(s) * 0

    return layer


def beside_compute_row(
    shape: dict, size_mib: float, values: int = 1, calls: int = 3, minor: int = 0
) -> dict:
    """The time offloading ``size_mib`` MiB a layer adds to :func:`beside_compute_layer`'s scan
    (``values`` tagged values of that many bytes together, ``minor`` wide in their last dimension
    where given; ``shape["attention"]``, (seq, head dim, interpret): layers of splash attention
    instead of matmuls): the step storing them on the host and loading them back, against the
    same step keeping them on the device; with the offloading program's host bytes as XLA
    compiled them where the platform reports them."""
    from tierax.models.prefetch import prefetch_scan

    L, T, D = shape["layers"], shape["tokens"], shape["width"]
    per_value = int(size_mib * 2**20) // values
    wide = max(D, per_value // (T * 2) // D * D)  # bf16, a multiple of the width
    names = tuple(f"link_r{j}" for j in range(values))
    att = tuple(shape["attention"]) if shape.get("attention") else None
    layer = beside_compute_layer(shape["matmuls"], values, wide, D, minor, att)
    ks = jax.random.split(jax.random.key(8), 3)
    x0 = jax.random.normal(ks[0], (T, D), jnp.bfloat16)
    p = {
        "mm": (jax.random.normal(ks[1], (L, D, D), jnp.float32) / D**0.5).astype(jnp.bfloat16),
        "scale": (1 + 0.01 * jax.random.normal(ks[2], (L, values, wide))).astype(jnp.bfloat16),
    }
    out = {"values": values, "value_bytes": T * wide * 2, "layer_bytes": values * T * wide * 2}
    for label, keep, offload in (("offload", ("link_s",), names), ("keep", names, ("link_s",))):
        run = prefetch_scan(layer, keep=keep, offload=offload)
        fn = jax.jit(
            jax.grad(lambda x0, p, run=run: jnp.sum(run(x0, p).astype(jnp.float32)), (0, 1))
        )
        step = fn.lower(x0, p).compile()  # compiled once: timed, and its host bytes read
        out[f"{label}_s"] = back_to_back(step, (x0, p), calls=calls)
        if label == "offload":
            mem = step.memory_analysis()
            out["host_temp_bytes"] = getattr(mem, "host_temp_size_in_bytes", None)
    out["added_s"] = out["offload_s"] - out["keep_s"]
    return out


def slope_rate(rows: Sequence[dict], layers: int) -> float | None:
    """Bytes moved (both ways: the layers' stores less the last, which stays on the device, and as
    many loads) per added second: the inverse of the least-squares slope of the added time on the
    bytes over ``rows``; None where the time does not grow with the bytes."""
    xs = [2 * (layers - 1) * r["layer_bytes"] for r in rows]
    ys = [r["added_s"] for r in rows]
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return sxx / sxy if sxy > 0 else None


def link_beside_compute(shape: dict | None = None, calls: int = 3) -> dict:
    """The host link as a step's copies see it beside compute, each direction: tierax's prefetching
    scan over layers that each run a chain of matmuls and store one value on the host (loaded back
    in the backward), against the same scan keeping the value, at each of ``shape``'s sizes
    (:data:`BESIDE`).  Past the sizes the layers' compute hides, every byte stored and loaded adds
    its time at the link's rate, so the slope of the added time over the bytes moved is the rate
    each direction gets (the stores and loads run in different passes).  It is an upper bound: the
    layers' own work grows a little with the value, and so does the compute the copies hide under.
    On XLA:CPU offloading is a no-op: the figures there are noise around zero."""
    shape = shape or BESIDE
    rows = [beside_compute_row(shape, mib, calls=calls) for mib in shape["sizes_mib"]]
    rate = slope_rate(rows, shape["layers"])
    return {
        "method": "beside compute: the slope of the time offloading adds over the bytes moved",
        "shape": {k: v for k, v in shape.items() if k != "sizes_mib"},
        "rows": rows,
        "d2h_bytes_per_s": rate,
        "h2d_bytes_per_s": rate,
    }


def host_link_rates(tiny: bool = False) -> dict:
    """The host link ``tierax calibrate`` stores: the rate beside compute
    (:func:`link_beside_compute`), each direction's, with the round trip of
    :func:`step_link_rates` (little compute beside the copies) kept beside it; where the time does
    not grow with the bytes beside compute (nothing measured), the round trip's rate instead, and
    ``rate_from`` says which."""
    trip = (
        step_link_rates(layers=2, tokens=256, width=256, calls=2) if tiny else step_link_rates()
    )
    beside = link_beside_compute(BESIDE_TINY if tiny else BESIDE, calls=2 if tiny else 3)
    used = beside if beside["d2h_bytes_per_s"] else trip
    return {
        "rate_from": "beside compute" if used is beside else "round trip",
        "d2h_bytes_per_s": used["d2h_bytes_per_s"],
        "h2d_bytes_per_s": used["h2d_bytes_per_s"],
        "beside_compute": beside,
        "round_trip": trip,
    }


def host_loads_alone(layers: int, tokens: int, width: int, calls: int = 3) -> dict:
    """Host → device alone, as a layer scan's loads see it: a jitted scan over a [layers, tokens,
    width] bf16 stack in pinned host memory, each trip copying one slice to the device and reducing
    it (a cheap read of what arrived, so the copy is not dropped), against the same scan over the
    stack on the device.  The difference over the bytes is the loads' own rate; with the round trip
    (:func:`step_link_rates`) it splits the two directions.  Where the platform has no pinned host
    memory (XLA:CPU), says so instead."""
    dev = jax.devices()[0]
    x = jax.random.normal(jax.random.key(6), (layers, tokens, width), jnp.bfloat16)
    try:
        host = jax.device_put(x, jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host"))
    except Exception as e:  # noqa: BLE001 — the platform's refusal is the finding
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}

    def scan(stack, to_device: bool):
        def body(acc, i):
            v = jax.lax.dynamic_index_in_dim(stack, i, keepdims=False)
            if to_device:
                v = jax.device_put(v, jax.memory.Space.Device)
            return acc + jnp.sum(v.astype(jnp.float32)), None

        return jax.lax.scan(body, jnp.float32(0), jnp.arange(layers))[0]

    try:
        t_host = back_to_back(jax.jit(lambda h: scan(h, True)), (host,), calls)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    t_dev = back_to_back(jax.jit(lambda d: scan(d, False)), (x,), calls)
    nbytes = layers * tokens * width * 2
    load_s = t_host - t_dev
    return {
        "bytes": nbytes,
        "host_stack_s": t_host,
        "device_stack_s": t_dev,
        "h2d_bytes_per_s": nbytes / load_s if load_s > 0 else None,
    }
