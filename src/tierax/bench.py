"""``tierax bench``: run plans side by side on the local devices and measure them.

All plans are compiled first, then timed in interleaved rounds (one step of each
plan per round) so that machine noise hits every plan alike.  The local peak
FLOP/s used for MFU is measured in the same run with a large matmul.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp

from tierax import inventory as inv
from tierax import plan as plan_lib
from tierax.measure import memory
from tierax.models import ModelConfig, config_to_dict
from tierax.models.flops import train_flops
from tierax.mesh import MeshShape
from tierax.train import sharding as sh
from tierax.train import step as step_lib

SCHEMA = "tierax.bench/1"


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
    runtime_host_stats: dict | None = None  # memory_stats keys about host memory, if the backend reports any


def measure_peak_flops(dtype: str = "float32", n: int = 1024, repeats: int = 5) -> float:
    """Achieved matmul FLOP/s of one local device (best of ``repeats``)."""
    dev = jax.devices()[0]
    a = jax.device_put(jnp.ones((n, n), jnp.dtype(dtype)), dev)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def machine_info() -> dict:
    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
    }


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
    progress: Callable[[str, int], None] | None = None,
) -> tuple[list[BenchRecord], float]:
    """Benchmark ``plans``; returns (records, measured peak FLOP/s per device).

    ``microbatch`` is sequences per device (MaxText's per-device batch); the global
    batch is ``microbatch × mesh.batch_ways`` (``mesh`` default: fsdp over all local devices).
    """
    shape = mesh or MeshShape(fsdp=jax.device_count())
    mesh = shape.make()
    n_dev = mesh.size
    batch = microbatch * shape.batch_ways
    flops = train_flops(cfg, batch, seq)
    inventory = inv.model_inventory(cfg, microbatch, seq, shape.to_dict())
    optimizer = step_lib.make_optimizer()
    tokens = jax.device_put(step_lib.synthetic_batch(cfg, batch, seq, seed=seed), sh.batch_sharding(mesh))

    peak = measure_peak_flops(cfg.dtype)
    runs = []
    for p in plans:
        probe = memory.PeakProbe(mesh.devices.flat)  # this plan's state, compile and warm-up steps
        graphdef, state = step_lib.init_state(cfg, optimizer, seed=seed, mesh=mesh)
        fn = step_lib.make_train_step(graphdef, cfg, p, optimizer, step_lib.shardings_of(state))
        t0 = time.perf_counter()
        compiled = fn.lower(state, tokens).compile()
        compile_s = time.perf_counter() - t0
        cmem = memory.compiled_memory(compiled)
        temp = cmem.temp
        for _ in range(warmup):
            state, metrics = compiled(state, tokens)
        jax.block_until_ready(state)
        runs.append({"plan": p, "fn": compiled, "state": state, "times": [], "loss": None,
                     "temp": temp, "compile_s": compile_s, "cmem": cmem, "runtime": probe.finish()})
        if progress:
            progress(f"compiled {p.name}", 1)
    for _ in range(steps):
        for r in runs:
            t0 = time.perf_counter()
            r["state"], metrics = r["fn"](r["state"], tokens)
            jax.block_until_ready(r["state"])
            r["times"].append(time.perf_counter() - t0)
            r["loss"] = float(metrics["loss"])
        if progress:
            progress("step", 1)
    records = []
    for r in runs:
        med = statistics.median(r["times"])
        by = inv.bytes_by_placement(inventory, r["plan"], cfg)
        achieved = flops / med / n_dev
        records.append(
            BenchRecord(
                plan=r["plan"].name,
                step_time_s=med,
                tokens_per_s=batch * seq / med,
                tflops_per_device=achieved / 1e12,
                mfu=achieved / peak,
                compiled_temp_bytes=r["temp"],
                device_activation_bytes=by["device"],
                host_activation_bytes=by["offload"],
                remat_activation_bytes=by["remat"],
                loss=r["loss"],
                compile_time_s=r["compile_s"],
                step_times_s=tuple(r["times"]),
                peak_device_bytes_compiled=r["cmem"].peak,
                host_bytes_compiled=r["cmem"].host_total,
                peak_device_bytes_runtime=r["runtime"].peak_bytes if r["runtime"] else None,
                runtime_peak_exact=r["runtime"].exact if r["runtime"] else None,
                memory_source=memory.RUNTIME if r["runtime"] else memory.COMPILED,
                runtime_host_stats=(r["runtime"].host_stats or None) if r["runtime"] else None,
            )
        )
    return records, peak


def bench_document(cfg, records, peak, *, command: str, microbatch: int, seq: int, steps: int,
                   mesh: MeshShape) -> dict:
    """The JSON record written under bench/results/."""
    devices = mesh.batch_ways
    return {
        "schema": SCHEMA,
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "jax_version": jax.__version__,
        "model": config_to_dict(cfg),  # loadable as is with --model-config
        "microbatch_per_device": microbatch,
        "global_batch": microbatch * devices,
        "seq": seq,
        "steps": steps,
        "mesh": mesh.to_dict(),
        "train_flops_per_step": train_flops(cfg, microbatch * devices, seq),
        "flops_convention": "MaxText: 6·matmul params·tokens + 3·causal attention (tierax.models.flops)",
        "activation_bytes_note": "named activations only, from the abstract trace, per device assuming batch-sharded activations",
        "peak_flops_per_device_measured": peak,
        "memory_note": (memory.RUNTIME_NOTE + "; a runtime peak is the bytes a plan added at its high-water mark "
                        "(its state, compile and warm-up steps)")
        if any(r.peak_device_bytes_runtime is not None for r in records) else memory.NO_RUNTIME_NOTE,
        "records": [asdict(r) for r in records],
    }
