"""``tierax calibrate``: measure the rates the cost model uses, on the machine at hand.

Measured (:mod:`tierax.measure.harness`): the rate at which a layer's non-matmul work (a norm, a
gated activation, a softmax, their gradients) moves the bytes the cost model counts for it (the
non-matmul term), the bandwidth of a streaming elementwise fusion (for reference), on a CPU the
rate at which fresh buffers are first written (page
faults: the cost model's first-touch term) and the rate at which XLA:CPU's slow transposing
fusion reads its inputs (the transposing-fusion term),
the matmul rate per compute dtype (float32 and
bfloat16; on a CPU a mix of GEMM shapes as the three GEMMs a training step runs, their own page
faults taken off at that first-touch rate, on a GPU one large square GEMM), on a CPU the same
rate for GEMMs whose smallest dimension is smaller (``harness.CPU_MATMUL_SIZE_DIMS``: a GEMM
that reuses each loaded element fewer times runs slower), on a CPU the bfloat16
LM head's GEMMs as the loss writes them (float32 products: another XLA:CPU kernel), and on a GPU the
host↔device copy bandwidth each way (pinned host memory).  Results are stored in
``tierax.costmodel.calibration_file()`` under the target key (``cpu`` here; the GPU kind on a GPU)
and used by ``simulate`` and ``plan`` instead of datasheet figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jax

from tierax import costmodel as cm
from tierax.fileio import write_text_atomic
from tierax.hardware.device_kinds import target_key_for
from tierax.measure import harness

DTYPES = ("float32", "bfloat16")
# Compute dtypes whose LM head GEMMs XLA:CPU runs in another form than their layer GEMMs (a
# float32 output from bfloat16 operands: harness.HEAD_MATMUL_ROLES); a float32 step's head GEMMs
# are float32 GEMMs like its layers', priced at the mix's rate.
HEAD_DTYPES = ("bfloat16",)


def target_key() -> str:
    """The calibration key of this backend's first device (:func:`target_key_for`)."""
    dev = jax.devices()[0]
    return target_key_for(dev.platform, dev.device_kind)


TPU_STAGES = (
    "memory",
    "matmul bfloat16",
    "matmul bfloat16 by size",
    "splash attention",
    "host link",
)


def stages(gpu: bool, tpu: bool = False) -> list[str]:
    """The measurements :func:`measure` makes, in order (what a progress bar counts)."""
    if tpu:
        return list(TPU_STAGES)
    return (
        ["memory"]
        + ([] if gpu else ["transposing fusion"])
        + [f"matmul {d}" for d in DTYPES]
        + ([] if gpu else [f"matmul {d} by size" for d in DTYPES])
        + ([] if gpu else [f"head matmul {d}" for d in HEAD_DTYPES])
        + (["host link"] if gpu else [])
    )


def measure(
    progress: Callable[[str], None] | None = None, *, matmul_n: int = 8192, repeats: int = 5
) -> dict:
    """One calibration entry for the local backend (nothing is saved); ``progress(stage)`` after
    each stage.  ``matmul_n``: the square GEMM's size on a GPU (a CPU runs
    :data:`harness.CPU_MATMUL_SHAPES`).
    """
    gpu = jax.devices()[0].platform == "gpu"
    if jax.devices()[0].platform == "tpu":
        return measure_tpu(progress)
    entry: dict = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "microbenchmarks": {},
    }
    micro = entry["microbenchmarks"]
    # Memory first: on a CPU the GEMMs' own page faults are taken off at its first-touch rate.
    mem = harness.stream_and_first_touch((1 << 30) if gpu else (64 << 20), repeats=repeats + 2)
    micro["memory"] = mem
    entry["stream_bytes_per_s"] = mem["memory_bytes_per_s"]
    touch = mem.get("first_touch_bytes_per_s")
    if touch:
        entry["first_touch_bytes_per_s"] = touch
    # What the non-matmul term reads: a layer's non-matmul work at the bytes the model counts.
    nm = harness.nonmatmul_rate(
        harness.GPU_NONMATMUL_SHAPE if gpu else None,
        repeats=repeats + 2,
        first_touch_bytes_per_s=touch,
    )
    micro["nonmatmul"] = nm
    entry["memory_bytes_per_s"] = nm["bytes_per_s"]
    if progress:
        progress("memory")
    if not gpu:  # XLA:CPU's transposing fusions (tierax.tracing.hbm.transposed_reads)
        tr = harness.transposed_fusion_rate(repeats=repeats, first_touch_bytes_per_s=touch)
        micro["transposed_fusion"] = tr
        entry["transpose_read_elems_per_s"] = tr["spread"]["elems_per_s"]
        entry["transpose_aliased_read_elems_per_s"] = tr["aliased"]["elems_per_s"]
        if progress:
            progress("transposing fusion")
    for dtype in DTYPES:
        if gpu:
            r = harness.matmul_rate(dtype, matmul_n, repeats, best=False)
        else:
            r = harness.matmul_mix_rate(dtype, repeats=repeats, first_touch_bytes_per_s=touch)
        entry[f"matmul_flops_per_s_{dtype}"] = r["flops_per_s"]
        micro[f"matmul_{dtype}"] = r
        if progress:
            progress(f"matmul {dtype}")
    if not gpu:  # the rate by a GEMM's smallest dimension, the mix its largest point
        mix_dim = min(min(shape) for shape in harness.CPU_MATMUL_SHAPES)
        for dtype in DTYPES:
            points, runs = [], {}
            for dim in harness.CPU_MATMUL_SIZE_DIMS:
                r = harness.matmul_mix_rate(
                    dtype,
                    shapes=harness.cpu_matmul_size_shapes(dim),
                    repeats=repeats,
                    first_touch_bytes_per_s=touch,
                )
                points.append([dim, r["flops_per_s"]])
                runs[str(dim)] = r
            entry[f"matmul_size_rates_{dtype}"] = points + [
                [mix_dim, entry[f"matmul_flops_per_s_{dtype}"]]
            ]
            micro[f"matmul_by_size_{dtype}"] = runs
            if progress:
                progress(f"matmul {dtype} by size")
        for dtype in HEAD_DTYPES:
            r = harness.matmul_mix_rate(
                dtype,
                shapes=harness.CPU_HEAD_MATMUL_SHAPES,
                repeats=repeats,
                first_touch_bytes_per_s=touch,
                roles=harness.HEAD_MATMUL_ROLES,
            )
            entry[f"head_matmul_flops_per_s_{dtype}"] = r["flops_per_s"]
            micro[f"head_matmul_{dtype}"] = r
            if progress:
                progress(f"head matmul {dtype}")
    # The key older tierax versions read (float32 only).
    entry["matmul_flops_per_s"] = entry["matmul_flops_per_s_float32"]
    if gpu:
        link = harness.link_bandwidth()
        entry["d2h_bytes_per_s"] = link["d2h_bytes_per_s"]
        entry["h2d_bytes_per_s"] = link["h2d_bytes_per_s"]
        micro["host_link"] = link
        if progress:
            progress("host link")
    return entry


def measure_tpu(progress: Callable[[str], None] | None = None, *, splash_cases=None) -> dict:
    """One calibration entry for a TPU (:mod:`tierax.measure.accel_rates`): the rate of a layer's
    non-matmul work at the bytes the model counts, bfloat16 GEMMs in a step's shapes and by smallest
    dimension, the splash kernel forward and backward by sequence and head dim (the entry's own
    rates: the case nearest seq 2048, head dim 128; ``splash_attention`` holds every case), and
    the host link each way through the step's own offload path beside compute
    (:func:`tierax.measure.accel_rates.host_link_rates`).  float32 matmuls run as bf16
    MXU passes on a TPU: the bf16 rate is stored for both."""
    from tierax.measure import accel_rates

    def done(stage: str) -> None:
        if progress:
            progress(stage)

    dev = jax.devices()[0]
    entry: dict = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device_kind": dev.device_kind,
        "jax": jax.__version__,
        "microbenchmarks": {},
    }
    micro = entry["microbenchmarks"]
    mem = harness.stream_and_first_touch(1 << 30, repeats=5)
    nm = harness.nonmatmul_rate(harness.GPU_NONMATMUL_SHAPE, repeats=7)
    micro["memory"], micro["nonmatmul"] = mem, nm
    entry["stream_bytes_per_s"] = mem["memory_bytes_per_s"]
    entry["memory_bytes_per_s"] = nm["bytes_per_s"]  # the rate the non-matmul term reads
    done("memory")
    mix = accel_rates.gemm_rates(accel_rates.STEP_GEMMS, "bfloat16")
    micro["matmul_bfloat16"] = mix
    for dtype in DTYPES:
        entry[f"matmul_flops_per_s_{dtype}"] = mix["flops_per_s"]
    entry["matmul_flops_per_s"] = mix["flops_per_s"]
    done("matmul bfloat16")
    by_size = accel_rates.gemm_size_rates("bfloat16", mix)
    micro["matmul_by_size_bfloat16"] = by_size["runs"]
    for dtype in DTYPES:
        entry[f"matmul_size_rates_{dtype}"] = by_size["points"]
    done("matmul bfloat16 by size")
    table = accel_rates.splash_rates(splash_cases or accel_rates.SPLASH_CASES)
    micro["splash_attention"] = table
    near = accel_rates.nearest_splash(table, 2048, 128)
    entry["fused_attention_fwd_flops_per_s"] = near["fwd_flops_per_s"]
    entry["fused_attention_bwd_flops_per_s"] = near["bwd_flops_per_s"]
    entry["splash_attention"] = [
        [r["seq"], r["head_dim"], r["fwd_flops_per_s"], r["bwd_flops_per_s"]] for r in table
    ]
    done("splash attention")
    if dev.platform == "tpu":  # XLA:TPU's gathers and scatters, priced apart from their bytes
        with_indexed(entry)
        done("gathers and scatters")
    link = accel_rates.host_link_rates()  # beside compute, the round trip beside it
    micro["host_link"] = link
    for way in ("d2h", "h2d"):
        if link[f"{way}_bytes_per_s"]:
            entry[f"{way}_bytes_per_s"] = link[f"{way}_bytes_per_s"]
    done("host link")
    return entry


def with_indexed(entry: dict, calls: int = 20) -> dict:
    """``entry`` with the gathers' and scatters' rates measured here
    (:func:`tierax.measure.accel_rates.indexed_rates`): its microbenchmark and the two rates the
    cost model reads."""
    from tierax.measure import accel_rates

    idx = accel_rates.indexed_rates(calls=calls)
    entry.setdefault("microbenchmarks", {})["indexed"] = idx
    entry["index_op_s"] = idx["index_op_s"]
    entry["scatter_bytes_per_s"] = idx["scatter_bytes_per_s"]
    return entry


def save(entry: dict, key: str | None = None) -> dict:
    """Store ``entry`` under ``key`` (default: this backend's) in the calibration file."""
    key = key or target_key()
    data = cm.load_calibration()
    data[key] = entry
    path = cm.calibration_file()
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    return {"target": key, "file": str(path), **entry}


def run_and_save(progress: Callable[[str], None] | None = None) -> dict:
    return save(measure(progress))
