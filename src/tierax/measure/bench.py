"""``tierax bench``: run plans side by side on the local devices and measure them.

All plans are compiled first, then timed in interleaved rounds (one step of each
plan per round) so that machine noise hits every plan alike.  The local peak
FLOP/s used for MFU is measured in the same run with a large matmul.
"""

from __future__ import annotations

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
    optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    tokens = jax.device_put(
        step_lib.synthetic_batch(cfg, batch, seq, seed=seed), sh.batch_sharding(mesh)
    )

    peak = harness.matmul_rate(cfg.dtype)["flops_per_s"]
    runs = []
    for p in plans:

        def build(p=p):
            graphdef, state = step_lib.init_state(cfg, optimizer, seed=seed, mesh=mesh, plan=p)
            return step_lib.make_train_step(
                graphdef, cfg, p, optimizer, step_lib.shardings_of(state)
            ), state

        runs.append(
            (p, harness.prepare(build, tokens, warmup=warmup, devices=mesh.devices.flat), [])
        )
        if progress:
            progress(f"compiled {p.name}", 1)
    for _ in range(steps):
        for _p, prepared, times in runs:
            t0 = time.perf_counter()
            prepared.step(tokens)
            times.append(time.perf_counter() - t0)
        if progress:
            progress("step", 1)
    records = []
    for p, r, times in runs:
        med = statistics.median(times)
        by = inv.bytes_by_placement(inventory, p, cfg)
        achieved = flops / med / n_dev
        records.append(
            BenchRecord(
                plan=p.name,
                step_time_s=med,
                tokens_per_s=batch * seq / med,
                tflops_per_device=achieved / 1e12,
                mfu=achieved / peak,
                compiled_temp_bytes=r.compiled_memory.temp,
                device_activation_bytes=by["device"],
                host_activation_bytes=by["offload"],
                remat_activation_bytes=by["remat"],
                loss=float(r.metrics["loss"]),
                compile_time_s=r.compile_s,
                step_times_s=tuple(times),
                peak_device_bytes_compiled=r.compiled_memory.peak,
                host_bytes_compiled=r.compiled_memory.host_total,
                peak_device_bytes_runtime=r.runtime.peak_bytes if r.runtime else None,
                runtime_peak_exact=r.runtime.exact if r.runtime else None,
                memory_source=memory.RUNTIME if r.runtime else memory.COMPILED,
                runtime_host_stats=(r.runtime.host_stats or None) if r.runtime else None,
            )
        )
    return records, peak


def bench_document(
    cfg, records, peak, *, command: str, microbatch: int, seq: int, steps: int, mesh: MeshShape
) -> dict:
    """The JSON record written under bench/results/ (:data:`tierax.records.BENCH_SCHEMA`)."""
    batch = microbatch * mesh.batch_ways
    return (
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
            "peak_flops_per_device_measured": peak,
            "memory_note": (
                memory.RUNTIME_NOTE
                + "; a runtime peak is the bytes a plan added at its high-water mark "
                "(its state, compile and warm-up steps)"
            )
            if any(r.peak_device_bytes_runtime is not None for r in records)
            else memory.NO_RUNTIME_NOTE,
            "records": [asdict(r) for r in records],
        }
    )


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
) -> dict:
    """``run_bench`` then ``bench_document``: the whole record of one ``tierax bench``."""
    shape = mesh or MeshShape(fsdp=jax.device_count())
    records, peak = run_bench(
        cfg, plans, steps=steps, microbatch=microbatch, seq=seq, mesh=shape, progress=progress
    )
    return bench_document(
        cfg, records, peak, command=command, microbatch=microbatch, seq=seq, steps=steps, mesh=shape
    )


def title(doc: dict) -> str:
    """One line naming what a bench record measured."""
    m = doc["machine"]
    return (
        f"{doc['model']['name']} · microbatch {doc['microbatch_per_device']}/device × seq "
        f"{doc['seq']} · {m['device_count']} {m['platform']} device(s) · median of {doc['steps']} "
        f"steps"
    )
