"""Measuring on the local devices: compile → warm up → time → memory probe; matmul rate; link
bandwidth.

``bench``, ``profile``, ``calibrate`` and ``bench/gpu_check.py`` all measure
through these functions, so a step time, a matmul rate or a copy bandwidth
means the same thing in every record.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from tierax.measure import memory


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    """(median, all) wall seconds of ``repeats`` calls of ``fn`` (which must block until done)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def matmul_rate(
    dtype: str = "float32", n: int = 1024, repeats: int = 5, *, best: bool = True
) -> dict:
    """Achieved n×n×n matmul FLOP/s of one local device on random data.

    Returns ``{"shape", "flops_per_s", "times_s"}``; ``flops_per_s`` uses the best
    (default) or the median time.
    """
    dev = jax.devices()[0]
    k1, k2 = jax.random.split(jax.random.key(1))
    a = jax.device_put(jax.random.normal(k1, (n, n), jnp.float32).astype(dtype), dev)
    b = jax.device_put(jax.random.normal(k2, (n, n), jnp.float32).astype(dtype), dev)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    med, times = median_time(lambda: f(a, b).block_until_ready(), repeats)
    t = min(times) if best else med
    return {
        "shape": f"{n}x{n}x{n} {jnp.dtype(dtype).name}",
        "flops_per_s": 2.0 * n**3 / t,
        "times_s": times,
    }


# Matmul shapes (M, K, N) of `tierax calibrate` on a CPU: y[M, N] = x[M, K]·W[K, N] for a
# layer-like W (width × 4·width) and a head-like one (width × vocabulary), M tokens; each as the
# three GEMMs a training step runs for it (:data:`MATMUL_ROLES`).  No case of
# bench/time_fidelity.py has any of these dimensions.
CPU_MATMUL_SHAPES = ((1536, 640, 2560), (1536, 640, 24000))
# The GEMM rate by a GEMM's smallest dimension (Rates.matmul_size_rates): for each of these
# smallest dimensions d, GEMMs of shapes (M, K, N) = (1536, d, 2560) and (1536, 2560, d) in the
# same three roles; the mix above (smallest dimension 640) is the largest point.  No case of
# bench/time_fidelity.py has any of these dimensions.
CPU_MATMUL_SIZE_DIMS = (40, 88, 176, 352)


def cpu_matmul_size_shapes(dim: int) -> tuple:
    """The GEMM shapes (M, K, N) measured for smallest dimension ``dim``."""
    m, wide = CPU_MATMUL_SHAPES[0][0], CPU_MATMUL_SHAPES[0][2]
    return ((m, dim, wide), (m, wide, dim))


# The head-like one alone, in the LM head's forms (:data:`HEAD_MATMUL_ROLES`).
CPU_HEAD_MATMUL_SHAPES = CPU_MATMUL_SHAPES[1:]
# role → (lhs shape, rhs shape, the GEMM) from (M, K, N, dtype), each as XLA:CPU runs it in a
# train step (the steps' optimised HLO).  Forward and input gradient: YNNPACK GEMMs.  The
# weight gradient dW[K, N] = xᵀ·dy: in float32 an Eigen dot of x (contracted over its major
# dimension) and dy laid out transposed [N, M] (contracted over its minor one; the transposing
# fusion that writes it is priced apart, tierax.costmodel.transposes); in bfloat16 XLA:CPU
# converts the operands to float32 and lays them out for a YNNPACK GEMM, so there the GEMM is
# written as JAX writes it (dot_general(dy, x) over the tokens, transposed) and XLA chooses.
_DN = {
    "forward": (((1,), (0,)), ((), ())),
    "input-gradient": (((1,), (1,)), ((), ())),
    "weight-gradient": (((0,), (0,)), ((), ())),
    "eigen-weight-gradient": (((0,), (1,)), ((), ())),
}


def _weight_gradient(m: int, k: int, n: int, dtype: str):
    if jnp.dtype(dtype) == jnp.float32:
        return (m, k), (n, m), lambda x, dyt: _dot(x, dyt, "eigen-weight-gradient")
    return (m, n), (m, k), lambda dy, x: _dot(dy, x, "weight-gradient").T


MATMUL_ROLES = {
    "forward": lambda m, k, n, dt: ((m, k), (k, n), lambda x, w: _dot(x, w, "forward")),
    "input-gradient": lambda m, k, n, dt: (
        (m, n),
        (k, n),
        lambda dy, w: _dot(dy, w, "input-gradient"),
    ),
    "weight-gradient": _weight_gradient,
}

# The LM head's three GEMMs as the loss writes them off a TPU (tierax.models.loss): operands in
# the compute dtype, the product in float32 (preferred_element_type), the weight gradient over
# the tokens as JAX writes it.  With bfloat16 operands XLA:CPU runs the forward and the input
# gradient as YNNPACK GEMMs on the bfloat16 operands themselves and the weight gradient as a dot of
# float32 copies with no conversion back, where a bfloat16-output GEMM (every layer GEMM) has its
# operands converted to float32, runs the float32 GEMM and converts its product back — up to jax
# 0.11; jax 0.12's XLA:CPU runs a layer's forward and input-gradient GEMMs on bfloat16 operands
# too (the compiled HLO of each, per jax version: tests/test_time_model.py).
HEAD_MATMUL_ROLES = {
    "forward": lambda m, k, n, dt: ((m, k), (k, n), lambda x, w: _dot(x, w, "forward", f32=True)),
    "input-gradient": lambda m, k, n, dt: (
        (m, n),
        (k, n),
        lambda dy, w: _dot(dy, w, "input-gradient", f32=True),
    ),
    "weight-gradient": lambda m, k, n, dt: (
        (m, k),
        (m, n),
        lambda x, dy: _dot(x, dy, "weight-gradient", f32=True),
    ),
}


def _dot(a, b, role: str, f32: bool = False):
    return jax.lax.dot_general(a, b, _DN[role], preferred_element_type=jnp.float32 if f32 else None)


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed_calls(fn, args, repeats: int, warm: bool = True) -> tuple[list[float], list[int]]:
    """``repeats`` calls of ``fn(*args)`` after one warm-up (unless ``warm`` is false): (seconds,
    minor page faults) each."""
    if warm:
        jax.block_until_ready(fn(*args))
    times, faults = [], []
    for _ in range(repeats):
        f0, t0 = _minor_faults(), time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        faults.append(_minor_faults() - f0)
    return times, faults


def _less_first_touch(
    times: list[float], faults: list[int], first_touch_bytes_per_s: float | None
) -> tuple[float, float, float]:
    """(median seconds, median faulted bytes, the median over calls of each call's seconds less
    its own faulted bytes at ``first_touch_bytes_per_s``, each never below a tenth of the call: a
    first-touch rate measured under noise must not cancel the work).  Each call is paired with
    its own faults: how many pages a call faults in varies from call to call (the allocator
    reuses some buffers and not others), and its time with them."""
    page = os.sysconf("SC_PAGE_SIZE")
    raw = statistics.median(times)
    touched = statistics.median(faults) * page
    if not first_touch_bytes_per_s:
        return raw, touched, raw
    net = [
        max(t - f * page / first_touch_bytes_per_s, t / 10)
        for t, f in zip(times, faults, strict=True)
    ]
    return raw, touched, statistics.median(net)


def matmul_mix_rate(
    dtype: str,
    shapes=CPU_MATMUL_SHAPES,
    repeats: int = 5,
    first_touch_bytes_per_s: float | None = None,
    roles: dict | None = None,
) -> dict:
    """FLOP/s of a mix of matmuls: every shape in every role of :data:`MATMUL_ROLES`, the summed
    FLOPs over the summed median times (each GEMM weighs by its time, as in a step).  Rounds
    interleave the GEMMs, so machine noise hits each alike.

    On a CPU every call writes its result (and XLA:CPU's temporaries) into fresh pages, even
    with a donated output buffer; the step's model prices those page faults in its own
    first-touch term, so with ``first_touch_bytes_per_s`` each call's faulted bytes (minor page
    faults × page size) at that rate are taken off its time.

    Returns ``{"dtype", "flops_per_s", "gemms": [{"shape", "role", "flops_per_s", ...}]}``.
    """
    dev = jax.devices()[0]
    key = jax.random.key(2)
    runs = []
    for m, k, n in shapes:
        for role, gemm in (roles or MATMUL_ROLES).items():
            a_shape, b_shape, fn = gemm(m, k, n, dtype)
            a = jax.device_put(jax.random.normal(key, a_shape, jnp.float32).astype(dtype), dev)
            b = jax.device_put(jax.random.normal(key, b_shape, jnp.float32).astype(dtype), dev)
            f = jax.jit(fn)
            f(a, b).block_until_ready()
            runs.append(((m, k, n), role, f, a, b, [], []))
    for _ in range(repeats):
        for *_, f, a, b, times, faults in runs:
            f0, t = _minor_faults(), time.perf_counter()
            f(a, b).block_until_ready()
            times.append(time.perf_counter() - t)
            faults.append(_minor_faults() - f0)
    gemms, flops, secs = [], 0.0, 0.0
    for (m, k, n), role, *_, times, faults in runs:
        raw, touched, med = _less_first_touch(times, faults, first_touch_bytes_per_s)
        flops, secs = flops + 2.0 * m * k * n, secs + med
        gemms.append(
            {
                "shape": [m, k, n],
                "role": role,
                "flops_per_s": 2.0 * m * k * n / med,
                "raw_flops_per_s": 2.0 * m * k * n / raw,
                "first_touch_bytes": touched,
                "times_s": times,
            }
        )
    return {
        "dtype": jnp.dtype(dtype).name,
        "flops_per_s": flops / secs,
        "gemms": gemms,
        "first_touch_subtracted_at_bytes_per_s": first_touch_bytes_per_s,
    }


# A pass of the memory microbenchmark whose slowest fresh-buffer call took more than this many
# times its fastest saw page faults change cost within it (stream_and_first_touch's passes).
UNSETTLED_FRESH_SPREAD = 2.0
MEMORY_PASSES = 3


def settled(fresh_s: list[float]) -> bool:
    """Whether one pass's fresh-buffer calls ran in one state of the page-fault path: the slowest
    at most :data:`UNSETTLED_FRESH_SPREAD` × the fastest."""
    return max(fresh_s) <= UNSETTLED_FRESH_SPREAD * min(fresh_s)


def stream_and_first_touch(nbytes: int = 64 << 20, repeats: int = 7) -> dict:
    """Memory bandwidth of an elementwise fusion, and the cost of writing memory the process has
    not touched yet.

    ``y ← a·x + y`` over float32 arrays of ``nbytes`` each (larger than a CPU's last-level
    cache), run two ways in alternation: with ``y`` donated (the output reuses its buffer: 3 ×
    ``nbytes`` moved, the bandwidth), and without (a fresh output buffer per call).  A large
    fresh buffer comes from the operating system page by page on first write (XLA:CPU allocates
    each call's buffers anew), so ``nbytes`` over the difference of the medians is the
    first-touch rate.  A GPU's allocator reuses its pool: no such cost, none reported.

    A process's first fresh buffers can fault far slower than the rest (seen on this project's
    2-core VM after an idle spell: five calls at 118 ms, then 30 ms), which a median over one pass
    takes for the rate a step's steady state sees.  A pass that is not :func:`settled` is run again
    (at most :data:`MEMORY_PASSES` in all); the rates come from the last pass and every pass's
    times are reported (``passes``).
    """
    dev = jax.devices()[0]
    n = nbytes // 4
    x = jax.device_put(jnp.ones((n,), jnp.float32), dev)
    box = {"y": jax.device_put(jnp.ones((n,), jnp.float32), dev)}
    donated = jax.jit(lambda x, y: x * 0.5 + y, donate_argnums=1)
    fresh = jax.jit(lambda x, y: x * 0.5 + y)

    def run_donated():
        box["y"] = donated(x, box["y"])
        box["y"].block_until_ready()

    def run_fresh():
        fresh(x, box["y"]).block_until_ready()

    run_donated()
    run_fresh()
    passes = []
    while len(passes) < MEMORY_PASSES:
        t_don, t_fresh = [], []
        for _ in range(repeats):
            for fn, times in ((run_donated, t_don), (run_fresh, t_fresh)):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        passes.append({"donated_s": t_don, "fresh_s": t_fresh})
        if settled(t_fresh):
            break
    med_don, med_fresh = statistics.median(t_don), statistics.median(t_fresh)
    out = {
        "bytes_per_array": n * 4,
        "memory_bytes_per_s": 3 * n * 4 / med_don,
        "donated_s": t_don,
        "fresh_s": t_fresh,
        "passes": passes,
    }
    if dev.platform == "cpu":
        out["first_touch_bytes_per_s"] = n * 4 / max(med_fresh - med_don, 1e-9)
    return out


# The non-matmul work of a transformer layer, forward and backward, at a size no case has:
# tokens, width, MLP width, heads, sequence (tokens = 4 sequences).
NONMATMUL_SHAPE = {"tokens": 1536, "width": 640, "mlp": 2560, "heads": 5, "seq": 384}
GPU_NONMATMUL_SHAPE = {"tokens": 8192, "width": 3072, "mlp": 12288, "heads": 24, "seq": 2048}


def _layer_nonmatmul(x, g, a, b, s):
    """An RMSNorm with its residual add, a SwiGLU gate, a softmax: no matmul."""
    r = jnp.mean(x * x, axis=-1, keepdims=True)
    n = x * jax.lax.rsqrt(r + 1e-6) * g[None, :]
    u = a * jax.nn.sigmoid(a) * b
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return n + x, u, e / jnp.sum(e, axis=-1, keepdims=True)


def nonmatmul_rate(
    shape: dict | None = None, repeats: int = 7, first_touch_bytes_per_s: float | None = None
) -> dict:
    """The bytes per second at which a layer's non-matmul work runs, counting its bytes as the
    cost model counts them: :func:`_layer_nonmatmul` and its gradient (``jax.vjp``), its bytes
    by :func:`tierax.tracing.hbm.phase_bytes` on the same trace, over the median time.  On a CPU
    this is well below a streaming copy's bandwidth (reductions, exponentials, XLA:CPU's own
    fusions); the call's page faults are taken off at ``first_touch_bytes_per_s`` as for the
    GEMMs."""
    from tierax.tracing import hbm

    d = NONMATMUL_SHAPE | (shape or {})
    t, w, f = d["tokens"], d["width"], d["mlp"]
    scores = (t // d["seq"], d["heads"], d["seq"], d["seq"])

    def fwd_bwd(x, g, a, b, s, ct):
        y, vjp = jax.vjp(_layer_nonmatmul, x, g, a, b, s)
        return y, vjp(hbm.marker(ct))

    keys = jax.random.split(jax.random.key(4), 5)
    args = (
        jax.random.normal(keys[0], (t, w)),
        jnp.ones((w,)),
        jax.random.normal(keys[1], (t, f)),
        jax.random.normal(keys[2], (t, f)),
        jax.random.normal(keys[3], scores),
        (jnp.ones((t, w)), jnp.ones((t, f)), jnp.ones(scores)),
    )
    nbytes = sum(hbm.phase_bytes(jax.make_jaxpr(fwd_bwd)(*args)))
    times, faults = _timed_calls(jax.jit(fwd_bwd), args, repeats)
    _, touched, med = _less_first_touch(times, faults, first_touch_bytes_per_s)
    return {
        "shape": d,
        "model_bytes": nbytes,
        "bytes_per_s": nbytes / med,
        "times_s": times,
        "first_touch_bytes": touched,
    }


# A weight gradient's operand as XLA:CPU computes it transposed
# (tierax.tracing.hbm.transposed_reads):
# rows (tokens) × columns (features) of float32, rows 5 KiB and 8 KiB apart (the two row-stride
# classes of tierax.tracing.hbm.row_aliased), no case's dimensions; layers of a scan.
TRANSPOSE_SHAPES = {"spread": (1536, 1280), "aliased": (1536, 2048)}
TRANSPOSE_LAYERS = 4


def _transposing_loop(layers: int):
    """A backward loop's two transposing fusions per layer, as a SwiGLU gate's backward makes
    them for the weight gradients: each reads a plain array and two residuals sliced from a
    scan's stacks at the loop index and writes its result transposed; 3 inputs each."""

    def loop(g_stack, u_stack, a):
        def body(carry, i):
            g, u = g_stack[i], u_stack[i]
            return carry, (((a * g) * (1 - u) + u).T, ((a * u) * (1 - g)).T)

        return jax.lax.scan(body, 0, jnp.arange(layers))[1]

    return jax.jit(loop)


def transposed_fusion_rate(
    shapes: dict | None = None,
    repeats: int = 5,
    first_touch_bytes_per_s: float | None = None,
    layers: int = TRANSPOSE_LAYERS,
) -> dict:
    """Elements per second that XLA:CPU's slow transposing fusions read, per row-stride class
    (``shapes``: ``{class: (rows, columns)}``, :data:`TRANSPOSE_SHAPES`): the loop of
    :func:`_transposing_loop` over ``layers`` stacked float32 residuals, in the form the train
    step's backward loop runs them (a plain fusion at the top level of a program runs 1.6–1.7×
    faster, and its rows' stride matters less: ``bench/investigations/transpose_forms.py``).  Rounds
    interleave the classes, so machine noise hits each alike; each call's faulted bytes are
    taken off at ``first_touch_bytes_per_s`` as for the GEMMs."""
    shapes = shapes or TRANSPOSE_SHAPES
    loop = _transposing_loop(layers)
    cases = {}
    for cls, (rows, cols) in shapes.items():
        keys = jax.random.split(jax.random.key(3), 3)
        g, u = (jax.random.normal(k, (layers, rows, cols), jnp.float32) for k in keys[:2])
        a = jax.random.normal(keys[2], (rows, cols), jnp.float32)
        jax.block_until_ready(loop(g, u, a))
        cases[cls] = ((g, u, a), [], [])
    for _ in range(repeats):
        for args, times, faults in cases.values():
            t, f = _timed_calls(loop, args, 1, warm=False)
            times += t
            faults += f
    out = {"layers": layers, "inputs": 3, "fusions_per_layer": 2}
    for cls, (_, times, faults) in cases.items():
        rows, cols = shapes[cls]
        _, touched, med = _less_first_touch(times, faults, first_touch_bytes_per_s)
        out[cls] = {
            "shape": [rows, cols],
            "row_stride_bytes": cols * 4,
            "elems_per_s": 2 * 3 * rows * cols * layers / med,
            "times_s": times,
            "first_touch_bytes": touched,
        }
    return out


def link_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> dict:
    """Pinned-host ↔ device copy bandwidth each way (median of ``repeats``), data checked after the
    round trip."""
    from jax.sharding import SingleDeviceSharding

    dev = jax.devices()[0]
    x = jax.device_put(
        jax.random.uniform(jax.random.key(0), (nbytes // 2,), jnp.float32).astype(jnp.bfloat16), dev
    )
    x.block_until_ready()
    to_host = SingleDeviceSharding(dev, memory_kind="pinned_host")
    to_dev = SingleDeviceSharding(dev, memory_kind="device")
    box = {}

    def d2h():
        box["h"] = jax.device_put(x, to_host)
        box["h"].block_until_ready()

    def h2d():
        box["d"] = jax.device_put(box["h"], to_dev)
        box["d"].block_until_ready()

    d2h()
    h2d()  # warm-up: first transfers set up staging
    t_d2h, d2h_times = median_time(d2h, repeats)
    t_h2d, h2d_times = median_time(h2d, repeats)
    ok = bool(np.array_equal(np.asarray(box["d"][: 1 << 16]), np.asarray(x[: 1 << 16])))
    out = {
        "bytes": nbytes,
        "memory_kind": str(getattr(box["h"].sharding, "memory_kind", "?")),
        "d2h_bytes_per_s": nbytes / t_d2h,
        "h2d_bytes_per_s": nbytes / t_h2d,
        "d2h_s": d2h_times,
        "h2d_s": h2d_times,
        "round_trip_equal": ok,
    }
    if dev.platform == "cpu":
        out["note"] = "CPU: host-to-host memcpy, not a link measurement"
    return out


@dataclass
class Prepared:
    """A compiled step, warmed up, with its state and memory figures."""

    fn: Callable
    state: object
    compile_s: float
    compiled_memory: memory.CompiledMemory
    runtime: (
        memory.RuntimePeak | None
    )  # high-water mark of state + compile + warm-up, where the backend reports it
    metrics: object = None

    def step(self, batch) -> None:
        """One step, blocking until it is done."""
        self.state, self.metrics = self.fn(self.state, batch)
        jax.block_until_ready(self.state)


def prepare(
    build: Callable[[], tuple[Callable, object]],
    batch,
    *,
    warmup: int,
    devices: Sequence | None = None,
    compiled: tuple | None = None,
) -> Prepared:
    """``build()`` → (jitted step, state); compile it for ``(state, batch)`` (``compiled``: (the
    program, its compile seconds) already made for the same shapes); run ``warmup`` steps.

    The memory probe covers all of it (the state's allocation included).
    """
    probe = memory.PeakProbe(devices)
    fn, state = build()
    if compiled is not None:
        compiled, compile_s = compiled
    else:
        t0 = time.perf_counter()
        compiled = fn.lower(state, batch).compile()
        compile_s = time.perf_counter() - t0
    p = Prepared(compiled, state, compile_s, memory.compiled_memory(compiled), None)
    for _ in range(warmup):
        p.step(batch)
    jax.block_until_ready(p.state)
    p.runtime = probe.finish()
    return p
