"""``tierax bench``: run plans side by side on the local devices and measure them.

One plan's state and program are on the devices at a time; plans take turns in rounds, so
machine drift hits every plan alike, and a plan the device refuses is recorded as such while the
others run.  MFU divides by the target's datasheet peak where the device kind names a target (a TPU,
a GPU) and the record also carries a peak measured in the same run (the GEMM rate at the step's
own shapes on an accelerator; a square matmul on a CPU, the only peak there).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import jax

from tierax import plan as plan_lib
from tierax.measure import harness, memory
from tierax.mesh import MeshShape
from tierax.models import ModelConfig, config_to_dict
from tierax.models.flops import train_flops
from tierax.records import BENCH_SCHEMA, envelope
from tierax.sharding import rules as sh
from tierax.tracing import inventory as inv
from tierax.train import step as step_lib


@dataclass(frozen=True)
class BenchRecord:
    plan: str
    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float
    compiled_temp_bytes: int
    device_activation_bytes: int
    host_activation_bytes: int
    remat_activation_bytes: int
    loss: float
    compile_time_s: float
    step_times_s: tuple[float, ...]
    # Memory (tierax.measure.memory): XLA's compiled figures always; the allocator's peak where the
    # backend reports one (memory_source "runtime"), else None (memory_source "compiled").
    peak_device_bytes_compiled: int = 0
    host_bytes_compiled: int = 0
    peak_device_bytes_runtime: int | None = None
    runtime_peak_exact: bool | None = None  # False: an upper bound (an earlier plan peaked higher)
    memory_source: str = "compiled"
    runtime_host_stats: dict | None = (
        None  # memory_stats keys about host memory, if the backend reports any
    )
    mfu_measured_peak: float | None = None  # achieved over the peak measured here (Peaks)
    peak_device_bytes_compiled_source: str = memory.CompiledMemory.peak_source


@dataclass(frozen=True)
class NotRun:
    """A plan that did not run: the device refused it (out of memory, at compile or run time) or
    it failed otherwise; ``error`` is the runtime's or compiler's own message."""

    plan: str
    stage: str  # "compile" or "run"
    out_of_memory: bool
    error: str


@dataclass(frozen=True)
class Peaks:
    """What MFU divides by: the target's datasheet peak per device (None off a known target: a
    CPU) and a peak measured here (the GEMM rate at the step's own shapes on an accelerator; a
    square matmul on a CPU), each with what it is."""

    measured: float
    measured_source: str
    datasheet: float | None = None
    datasheet_source: str | None = None

    @property
    def mfu_basis(self) -> float:
        return self.datasheet or self.measured


OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "exceeds available HBM", "Ran out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device refusing memory (XLA's compile-time HBM check, the runtime's
    allocation failure), not another fault."""
    text = str(exc)
    return any(m.lower() in text.lower() for m in OOM_MARKERS)


def free(tree) -> None:
    """Delete the device buffers of ``tree`` now (not when Python collects them), so the next
    plan's state has the memory."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


def step_gemm_shapes(cfg: ModelConfig, tokens: int) -> tuple[tuple[int, int, int], ...]:
    """The GEMMs (M, K, N) a layer of ``cfg`` runs over ``tokens`` tokens: the query projection,
    the MLP's up and down projections (a MoE's expert width), at most 32k tokens (the rate has
    settled long before)."""
    t = min(tokens, 32768)
    d = cfg.d_model
    head = getattr(cfg, "head_dim", 0) or (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    q = cfg.num_heads * head
    mlp = getattr(cfg, "mlp_dim", 0) or cfg.dense_mlp_dim
    return ((t, d, q), (t, d, mlp), (t, mlp, d))


def peaks_for(cfg: ModelConfig, tokens_per_device: int) -> Peaks:
    """:class:`Peaks` for this backend: on a TPU or GPU the datasheet peak of the target its device
    kind names and the GEMM rate at the step's own shapes, back to back
    (:mod:`tierax.measure.accel_rates`); on a CPU a measured square matmul only."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        r = harness.matmul_rate(cfg.dtype)
        return Peaks(r["flops_per_s"], f"{r['shape']} matmul, best of 5 calls (XLA:CPU)")
    from tierax import hardware
    from tierax.measure import accel_rates, calibrate

    shapes = step_gemm_shapes(cfg, tokens_per_device)
    dtype = "bfloat16" if cfg.dtype == "float32" and dev.platform == "tpu" else cfg.dtype
    r = accel_rates.gemm_rates(shapes, dtype)
    named = ", ".join("x".join(map(str, s)) for s in shapes)
    source = (
        f"{r['dtype']} GEMMs at the step's shapes {named} (forward, input and weight "
        "gradients), back to back"
    )
    key = calibrate.target_key_for(dev.platform, dev.device_kind)
    try:
        spec = hardware.get_target(key)
    except Exception:  # noqa: BLE001 — a device kind tierax has no table row for
        return Peaks(r["flops_per_s"], source)
    return Peaks(
        r["flops_per_s"],
        source,
        spec.peak(cfg.dtype),
        f"{spec.name} datasheet, {spec.peak_name(cfg.dtype)}",
    )


def run_bench(
    cfg: ModelConfig,
    plans: Sequence[plan_lib.Plan],
    *,
    steps: int = 10,
    microbatch: int = 8,
    seq: int = 64,
    mesh: MeshShape | None = None,
    warmup: int = 2,
    seed: int = 0,
    rounds: int | None = None,
    progress: Callable[[str, int], None] | None = None,
    peaks: Peaks | None = None,
) -> tuple[list[BenchRecord], Peaks, list[NotRun]]:
    """Benchmark ``plans``; returns (records of the plans that ran, the peaks MFU divides by, the
    plans that did not run).

    One plan's state and program are on the devices at a time: in each of ``rounds`` rounds (default
    up to 3) every plan in turn builds its state, runs its share of the ``steps`` timed steps and
    frees it, so drift hits every plan alike and a plan never shares memory with another.  Each
    plan compiles once (its first round, ``warmup`` steps after it; later rounds one).  A plan the
    device refuses (out of memory at compile or run time) is recorded with the message and the
    others still run.  ``peaks``: what MFU divides by, where an earlier run measured it.

    ``microbatch`` is sequences per device (MaxText's per-device batch); the global
    batch is ``microbatch × mesh.batch_ways`` (``mesh`` default: fsdp over all local devices).
    """
    shape = mesh or MeshShape(fsdp=jax.device_count())
    mesh = shape.make()
    n_dev = mesh.size
    batch = microbatch * shape.batch_ways
    flops = train_flops(cfg, batch, seq)
    inventory = inv.model_inventory(cfg, microbatch, seq, shape.to_dict())
    optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    tokens = jax.device_put(
        step_lib.synthetic_batch(cfg, batch, seq, seed=seed), sh.batch_sharding(mesh)
    )
    peaks = peaks or peaks_for(cfg, microbatch * seq)  # given: measured by an earlier run
    rounds = max(1, min(rounds or 3, steps))
    per_round = [steps // rounds + (1 if r < steps % rounds else 0) for r in range(rounds)]
    runs = {p.name: {"plan": p, "prepared": None, "times": [], "failed": None} for p in plans}
    ahead = compile_ahead(cfg, plans, optimizer, mesh, tokens, seed)
    for r, n_steps in enumerate(per_round):
        for run in runs.values():
            if run["failed"] is not None:
                continue
            p = run["plan"]
            prepared, state, stage = None, None, "compile"
            try:
                graphdef, state = step_lib.init_state(cfg, optimizer, seed=seed, mesh=mesh, plan=p)
                if run["prepared"] is None:
                    fn = step_lib.make_train_step(
                        graphdef, cfg, p, optimizer, step_lib.shardings_of(state)
                    )
                    done = ahead.get(p.name)
                    if isinstance(done, BaseException):
                        raise done
                    run["prepared"] = harness.prepare(
                        lambda fn=fn, state=state: (fn, state),
                        tokens,
                        warmup=warmup,
                        devices=mesh.devices.flat,
                        compiled=done,
                    )
                    prepared = run["prepared"]
                    stage = "run"
                    if progress:
                        progress(f"compiled {p.name}", 1)
                else:
                    prepared = run["prepared"]
                    prepared.state = state
                    stage = "run"
                    prepared.step(tokens)  # the first step of a fresh state: not timed
                for _ in range(n_steps):
                    t0 = time.perf_counter()
                    prepared.step(tokens)
                    run["times"].append(time.perf_counter() - t0)
                run["loss"] = float(prepared.metrics["loss"])
            except Exception as e:  # noqa: BLE001 — one plan's failure is that plan's record
                run["failed"] = NotRun(p.name, stage, is_out_of_memory(e), _first_lines(e))
                if progress and r == 0 and stage == "compile":
                    progress(f"{p.name} did not run", 1)
            finally:
                if prepared is not None:
                    free(prepared.state)
                    free(prepared.metrics)
                    prepared.state = prepared.metrics = None
                else:
                    free(state)
                gc.collect()
        if progress:
            progress("round", n_steps)
    records = []
    for run in runs.values():
        if run["failed"] is not None or not run["times"]:
            continue
        p, prep, times = run["plan"], run["prepared"], run["times"]
        med = statistics.median(times)
        by = inv.bytes_by_placement(inventory, p, cfg)
        achieved = flops / med / n_dev
        # On a TPU the allocator's high-water mark misses the program's own reservation (a plan's
        # bytes in a round came out at tens of MiB on the v5e chip:
        # bench/results/chip/bench_cli_mb8.json); XLA:TPU's peak is the figure that fits.
        rt = prep.runtime if jax.default_backend() != "tpu" else None
        records.append(
            BenchRecord(
                plan=p.name,
                step_time_s=med,
                tokens_per_s=batch * seq / med,
                tflops_per_device=achieved / 1e12,
                mfu=achieved / peaks.mfu_basis,
                compiled_temp_bytes=prep.compiled_memory.temp,
                device_activation_bytes=by["device"],
                host_activation_bytes=by["offload"],
                remat_activation_bytes=by["remat"],
                loss=run["loss"],
                compile_time_s=prep.compile_s,
                step_times_s=tuple(times),
                peak_device_bytes_compiled=prep.compiled_memory.peak,
                host_bytes_compiled=prep.compiled_memory.host_total,
                peak_device_bytes_runtime=rt.peak_bytes if rt else None,
                runtime_peak_exact=rt.exact if rt else None,
                memory_source=memory.RUNTIME if rt else memory.COMPILED,
                runtime_host_stats=(rt.host_stats or None) if rt else None,
                mfu_measured_peak=achieved / peaks.measured,
                peak_device_bytes_compiled_source=prep.compiled_memory.peak_source,
            )
        )
    return records, peaks, [run["failed"] for run in runs.values() if run["failed"] is not None]


def compile_ahead(
    cfg, plans, optimizer, mesh, tokens, seed: int = 0, *, on_cpu: bool = False
) -> dict:
    """Every plan's step compiled at once, in threads (XLA compiles one program per thread; a
    TPU or GPU host has the cores), before any runs: ``{plan: (Compiled, seconds) or the
    exception}``.  The programs take the state's shapes and shardings from one state built and
    freed first (a plan that places training state in host memory has other shardings: it is
    compiled when it runs, as are all plans on a CPU, whose cores run the steps, unless
    ``on_cpu``)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    same = [p for p in plans if not p.offloads_state]
    if (jax.default_backend() == "cpu" and not on_cpu) or len(same) < 2:
        return {}
    graphdef, state = step_lib.init_state(cfg, optimizer, seed=seed, mesh=mesh)
    shardings = step_lib.shardings_of(state)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    free(state)

    def one(p):
        t0 = time.perf_counter()
        try:
            fn = step_lib.make_train_step(graphdef, cfg, p, optimizer, shardings)
            return fn.lower(abstract, tokens).compile(), time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 — raised again when the plan's turn comes
            return e

    with ThreadPoolExecutor(max_workers=min(len(same), os.cpu_count() or 1)) as pool:
        return dict(zip([p.name for p in same], pool.map(one, same), strict=True))


def _first_lines(exc: BaseException, limit: int = 1200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " …"


def largest_fitting_microbatch(
    cfg: ModelConfig,
    plan: plan_lib.Plan,
    *,
    seq: int,
    start: int = 1,
    limit: int = 4096,
    mesh: MeshShape | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict:
    """The largest microbatch (sequences per device) at which ``plan``'s step compiles and runs on
    the local devices: doubling from ``start`` until the device refuses it (a real out-of-memory
    error at compile or run time), then bisection.  Returns ``{"microbatch", "refused_at",
    "probes": [{"microbatch", "fits", "error"}]}``; ``microbatch`` 0 where even ``start`` is
    refused, ``refused_at`` None where ``limit`` ran."""
    shape = mesh or MeshShape(fsdp=jax.device_count())
    jmesh = shape.make()
    optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    probes: list[dict] = []

    def fits(mb: int) -> bool:
        batch = mb * shape.batch_ways
        tokens = jax.device_put(step_lib.synthetic_batch(cfg, batch, seq), sh.batch_sharding(jmesh))
        state = metrics = None
        try:
            graphdef, state = step_lib.init_state(cfg, optimizer, mesh=jmesh, plan=plan)
            fn = step_lib.make_train_step(
                graphdef, cfg, plan, optimizer, step_lib.shardings_of(state)
            )
            compiled = fn.lower(state, tokens).compile()
            state, metrics = compiled(state, tokens)
            jax.block_until_ready(state)
            probes.append({"microbatch": mb, "fits": True, "error": None})
            return True
        except Exception as e:  # noqa: BLE001 — only the device's refusal answers the question
            if not is_out_of_memory(e):
                raise
            probes.append({"microbatch": mb, "fits": False, "error": _first_lines(e, 400)})
            return False
        finally:
            free(state)
            free(metrics)
            free(tokens)
            gc.collect()
            if progress:
                progress(f"microbatch {mb}", 1)

    lo, hi = 0, None
    mb = start
    while mb <= limit:
        if fits(mb):
            lo, mb = mb, mb * 2
        else:
            hi = mb
            break
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    return {"plan": plan.name, "seq": seq, "microbatch": lo, "refused_at": hi, "probes": probes}


def bench_document(
    cfg,
    records,
    peaks,
    *,
    command: str,
    microbatch: int,
    seq: int,
    steps: int,
    mesh: MeshShape,
    not_run: Sequence[NotRun] = (),
    max_microbatch: Sequence[dict] = (),
) -> dict:
    """The JSON record written under bench/results/ (:data:`tierax.records.BENCH_SCHEMA`);
    ``peaks``: a :class:`Peaks` (or a measured peak alone)."""
    if not isinstance(peaks, Peaks):
        peaks = Peaks(float(peaks), "measured")
    batch = microbatch * mesh.batch_ways
    doc = (
        envelope(BENCH_SCHEMA, command)
        | {
            "model": config_to_dict(cfg),  # loadable as is with --model-config
            "microbatch_per_device": microbatch,
            "global_batch": batch,
            "seq": seq,
            "steps": steps,
            "mesh": mesh.to_dict(),
            "train_flops_per_step": train_flops(cfg, batch, seq),
            "flops_convention": "MaxText: 6·matmul params·tokens + 3·causal attention "
            "(tierax.models.flops)",
            "activation_bytes_note": "named activations only, from the abstract trace, per device "
            "assuming batch-sharded activations",
            "peak_flops_per_device_measured": peaks.measured,
            "peak_flops_per_device_measured_source": peaks.measured_source,
            "peak_flops_per_device_datasheet": peaks.datasheet,
            "peak_flops_per_device_datasheet_source": peaks.datasheet_source,
            "mfu_basis": "datasheet" if peaks.datasheet else "measured",
            "memory_note": (
                memory.RUNTIME_NOTE
                + "; a runtime peak is the allocator's high-water mark over a plan's first "
                "round less the bytes in use before it (an upper bound, '≤', where an earlier plan "
                "peaked higher)"
            )
            if any(r.peak_device_bytes_runtime is not None for r in records)
            else memory.NO_RUNTIME_NOTE,
            "records": [asdict(r) for r in records],
            "not_run": [asdict(n) for n in not_run],
        }
    )
    if max_microbatch:
        doc["max_microbatch"] = list(max_microbatch)
    return doc


def measure(
    cfg: ModelConfig,
    plans: Sequence[plan_lib.Plan],
    *,
    steps: int,
    microbatch: int,
    seq: int,
    mesh: MeshShape | None,
    command: str,
    progress: Callable[[str, int], None] | None = None,
    max_microbatch: bool = False,
) -> dict:
    """``run_bench`` (then, with ``max_microbatch``, each plan's largest fitting microbatch on
    the devices) and ``bench_document``: the whole record of one ``tierax bench``."""
    shape = mesh or MeshShape(fsdp=jax.device_count())
    records, peaks, not_run = run_bench(
        cfg, plans, steps=steps, microbatch=microbatch, seq=seq, mesh=shape, progress=progress
    )
    largest = [
        largest_fitting_microbatch(cfg, p, seq=seq, start=microbatch, mesh=shape, progress=progress)
        for p in (plans if max_microbatch else ())
    ]
    return bench_document(
        cfg,
        records,
        peaks,
        command=command,
        microbatch=microbatch,
        seq=seq,
        steps=steps,
        mesh=shape,
        not_run=not_run,
        max_microbatch=largest,
    )


def title(doc: dict) -> str:
    """One line naming what a bench record measured."""
    m = doc["machine"]
    return (
        f"{doc['model']['name']} · microbatch {doc['microbatch_per_device']}/device × seq "
        f"{doc['seq']} · {m['device_count']} × {m.get('device_kind', m['platform'])} "
        f"({m['platform']}) · median of {doc['steps']} steps"
    )
