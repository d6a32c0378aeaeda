"""The model's constants for one target (:class:`Rates`): the hardware table, a measured
calibration, and
``--rate`` overrides."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import pathlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tierax import hardware
from tierax.errors import TieraxError
from tierax.hardware import kernel_rates, libtpu, tpu_rates

# A dense bf16 matmul reaches about 0.8 of the H100/H200 datasheet peak (publicly reported
# measurements): the rate of GPU targets and dtypes with no published sweep
# (tierax.hardware.kernel_rates: projections, float32 steps).  GPU targets with one take their
# sourced rates from there; TPU targets take the rates measured on a TPU chip
# (tierax.hardware.tpu_rates).
ACHIEVABLE_FRACTION = 0.8
# fp8 GEMMs (quantization: fp8) at the datasheet's dense fp8 peak times the same fraction: no fp8
# GEMM rate has been measured here, so the bf16 measurement's fraction stands in for it (a named
# assumption, not a fit; `tierax calibrate` or `--rate fp8_matmul=TFLOPS` replaces it).
FP8_SOURCE = (
    "{fraction:.0%} (the bf16 fraction, assumed for fp8: not measured) of the {peak:.0f} TFLOP/s "
    "fp8 dense datasheet peak"
)
# MXFP8 GEMMs (quantization: mxfp8, Blackwell) at that same fp8 rate: NVIDIA's B200 and GB200
# datasheets give one dense FP8 figure (4.5 / 5 PFLOP/s per GPU), and Blackwell's tensor cores run
# fp8 with MX block scales at it (NVIDIA Blackwell architecture technical brief: the second
# generation Transformer Engine's micro-tensor scaling).  Their block-scale quantize work (a block
# amax, a power-of-two scale, the e4m3 cast, in the forward and again along the other dimension in
# the backward) is HBM time: it is in the traced program (tierax.tracing.hbm), not in this rate.
MXFP8_SOURCE = (
    "MXFP8 block-scaled GEMMs at the fp8 rate (one dense FP8 datasheet figure covers FP8 with "
    "and without MX block scales: NVIDIA Blackwell architecture technical brief); their "
    "quantize work as HBM time"
)
# XLA:GPU's cuBLAS workspace, an s8[N] buffer in the peak set of every deviceless GPU compile (the
# live-range dump lists it at the peak).  XLA's GEMM rewriter gives every cuBLAS(Lt) call NVIDIA's
# recommended workspace (cuBLAS documentation, cublasSetWorkspace): 32 MiB from compute capability
# 9.0 (Hopper) on, 4 MiB before (XLA's GemmConfig::kHopperWorkspace and kDefaultWorkspace, applied
# by GemmWorkspaceRewriteVisitor).  A deviceless compile cannot autotune, so XLA's autotuner applies
# cuBLASLt's default config to each GEMM it reaches, and that config resizes the workspace to 4 MiB
# (CublasLtBackend::GetDefaultConfig).  It does not reach a GEMM inside a dynamic-slice fusion (a
# scanned layer's GEMM that reads its weight as a slice of the stacked weights, fused by
# xla_gpu_enable_dynamic_slice_fusion), which keeps the rewriter's size: jaxlib 0.11.1 is the first
# release that fuses them (0.10.2 and 0.11.0 compile no dynamic-slice fusion; the compiles per
# version and capability: bench/results/gemm_workspace.json, written by bench/gemm_workspace.py).
CUBLAS_WORKSPACE_BYTES = 4 * 2**20
CUBLAS_HOPPER_WORKSPACE_BYTES = 32 * 2**20
HOPPER_CAPABILITY = (9, 0)
DYNAMIC_SLICE_FUSION_JAXLIB = (0, 11, 1)
# cuDNN's fused flash attention (attention=cudnn), as a share of the dense 16-bit peak: its measured
# forward and backward rates on an H100 SXM5 at head dim 128, sequence 4k, against that GPU's 989
# TFLOP/s (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, the H100 benchmark figures' cuDNN
# bars; FLOPs by FlashAttention's convention: forward 4·B·S²·H·d, halved when causal, backward 2.5 ×
# forward).  Applied to every GPU target's own peak until a device measurement replaces it
# (bench/gpu_check.py records one).
FUSED_ATTENTION_SOURCE = (
    "cuDNN flash attention on H100 SXM5 (head dim 128, seq 4k): forward 609, backward 499 "
    "TFLOP/s of 989 (FlashAttention-3 paper, arXiv:2407.08608, benchmark figures), "
    "as shares of this target's peak"
)
FUSED_ATTENTION_FWD_FRACTION = 609 / 989
FUSED_ATTENTION_BWD_FRACTION = 499 / 989
# FlashAttention's backward convention: 5 matmuls of the forward's 2, i.e. 2.5 × its FLOPs.
FUSED_BACKWARD_FLOPS_RATIO = 2.5


def calibration_file() -> pathlib.Path:
    """Where ``tierax calibrate`` stores its measured rates and ``simulate``/``plan`` read them:
    ``$TIERAX_CALIBRATION``, else ``~/.cache/tierax/calibration.json``.  Read at each call, not at
    import: a path fixed when the module was imported would outlive a later change of the
    environment (a test's, a caller's) and write a file the caller moved elsewhere."""
    env = os.environ.get("TIERAX_CALIBRATION")
    if env:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".cache" / "tierax" / "calibration.json"


@dataclass(frozen=True)
class Rates:
    """The constants of the model for one target, each with where it came from."""

    target: str
    matmul_flops_per_s: float
    hbm_bytes_per_s: float
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    interconnect_bytes_per_s: float
    device_memory_bytes: int
    host_memory_bytes: int
    offload_is_real: bool
    sources: dict = field(default_factory=dict)
    fixed_device_bytes: int = (
        0  # buffers the compiler allocates whatever the model (XLA:GPU's cuBLAS workspace)
    )
    # Collectives whose group leaves an NVLink (ICI) domain run at the scale-out rate
    # (tierax.costmodel.network); nvlink_domain_gpus 0: one domain holds every device;
    # gpus_per_domain 0:
    # spread evenly (network.py).
    nvlink_domain_gpus: int = 0
    scale_out_bytes_per_s: float = 0.0
    gpus_per_domain: int = 0
    # The fused attention kernel's rates: cuDNN's (attention=cudnn) on a GPU target, splash
    # attention's (attention=splash) on a TPU target; 0 where none runs (CPU).
    fused_attention_fwd_flops_per_s: float = 0.0
    fused_attention_bwd_flops_per_s: float = 0.0
    # CPU only (0: no such cost): XLA:CPU allocates a step's temporary buffers anew on every
    # call, and the operating system hands each fresh page over on its first write; measured
    # by `tierax calibrate` (tierax.costmodel.first_touch).
    first_touch_bytes_per_s: float = 0.0
    # CPU only (0: no such term): elements per second XLA:CPU's slow transposing fusions read
    # (tierax.tracing.hbm.transposed_reads, tierax.costmodel.transposes); measured by `tierax
    # calibrate`.
    transpose_read_elems_per_s: float = 0.0
    # The same for reads of rows a multiple of 4 KiB apart (tierax.tracing.hbm.row_aliased).
    transpose_aliased_read_elems_per_s: float = 0.0
    # What a step may use, where the compiler states it (XLA:TPU's HBM limit); 0: capacity less
    # the runtime reserve (hardware.usable_bytes).
    device_limit_bytes: int = 0
    # The host's memory bandwidth per device (hardware table): what an optimizer update run on
    # the host would take (tierax.costmodel.state); 0: not known for this target.
    host_memory_bytes_per_s: float = 0.0
    # fp8 GEMMs (quantization: fp8); 0: the target has none in this table (they run at the
    # compute dtype's rate, emulated)
    fp8_matmul_flops_per_s: float = 0.0
    # CPU only (0: the matmul rate): the LM head's GEMMs (forward and both gradients, in the
    # loss's form: float32 products of compute-dtype operands), which XLA:CPU runs with another
    # kernel than a bfloat16 step's layer GEMMs; measured by `tierax calibrate`.
    head_matmul_flops_per_s: float = 0.0
    # (empty: matmul_flops_per_s for every GEMM): the GEMM rate by a GEMM's smallest dimension
    # (tierax.tracing.jaxpr_tools.gemm_min_dim), ((dimension, FLOP/s), ...) ascending, the GEMM
    # mix the largest point (matmul_rate_at): measured by `tierax calibrate`, or a GPU's published
    # shares (kernel_rates), or a TPU's measured on a chip (tierax.hardware.tpu_rates).
    matmul_size_rates: tuple = ()
    # TPU targets: the libtpu whose XLA:TPU memory figures the peak follows (target_rates: the
    # installed one; "": none installed, the terms traced on 0.0.52; tierax.hardware.libtpu).
    libtpu: str = ""
    # The share by which compute that hides a collective or a host copy runs slower (GPU targets:
    # tierax.hardware.kernel_rates.OVERLAP_SLOWDOWN; 0: not modelled).
    overlap_slowdown: float = 0.0
    # Whether fp8 GEMMs follow the GEMM rates by size (fp8 rate × the compute dtype's blended rate
    # over its largest point): a target whose sourced rates give the bf16 sweep's shape shares.
    fp8_by_size: bool = False
    # Whether the fused attention rates stand at kernel_rates.ATTENTION_REFERENCE (sequence, head
    # dim) until a program's own shape replaces them (for_program).
    attention_by_shape: bool = False
    # The fused attention kernel measured by shape (TPU targets: the splash kernel measured on a
    # chip, tierax.hardware.tpu_rates, or by a calibration on the target), as ((seq, head dim,
    # forward FLOP/s, backward FLOP/s), ...): for_program interpolates them at a program's shape
    # (attention_at).
    fused_attention_table: tuple = ()
    # TPU targets: the device bytes within which XLA:TPU's latency-hiding scheduler overlaps the
    # step's host copies (SCHEDULER_MEMORY_FRACTION of the limit); a step whose peak is above it
    # gets its prefetches serialized (costmodel.predict).  0: not modelled.
    scheduler_limit_bytes: int = 0
    # TPU targets: whether a layer's stores hide only under the part of its forward XLA:TPU's
    # in-place carry leaves them (tierax.costmodel.terms.store_window_s); False: under the whole
    # forward of their group.
    store_windows_by_name: bool = False
    # TPU targets measured so: seconds per index of a gather or scatter, and the bytes per second
    # a scatter writes its updates at (XLA:TPU runs both far below HBM bandwidth;
    # tierax.tracing.hbm.phase_indexed counts them); 0: priced as their bytes alone.
    index_op_s: float = 0.0
    scatter_bytes_per_s: float = 0.0
    # Whether the compiler's host memory lets the streamed update's second buffer of the
    # offloaded state share the offloaded activations' (dead by then) host memory: XLA:GPU's
    # deviceless compiles do (bench/results/state_offload.json); XLA:TPU's hold both
    # (tests/test_state_offload_compile.py compiles a v5e step): tierax.costmodel.state.host_peak.
    host_state_shares_activations: bool = True

    def matmul_rate_at(self, dim: float) -> float:
        """The GEMM rate of a matmul whose smallest dimension is ``dim``: piecewise linear in
        log ``dim`` between the measured :attr:`matmul_size_rates`, the nearest point's rate
        outside them; :attr:`matmul_flops_per_s` where none are measured."""
        pts = self.matmul_size_rates
        if not pts:
            return self.matmul_flops_per_s
        if dim <= pts[0][0]:
            return pts[0][1]
        for (d0, r0), (d1, r1) in zip(pts, pts[1:], strict=False):
            if dim <= d1:
                t = math.log(dim / d0) / math.log(d1 / d0)
                return r0 + t * (r1 - r0)
        return pts[-1][1]

    def blended_matmul_rate(self, min_dim_shares: tuple) -> float:
        """The rate of a set of GEMMs given as ((smallest dimension, share of FLOPs), ...): its
        FLOPs over the sum of each share's seconds at :meth:`matmul_rate_at`."""
        if not self.matmul_size_rates or not min_dim_shares:
            return self.matmul_flops_per_s
        total = sum(share for _, share in min_dim_shares)
        return total / sum(share / self.matmul_rate_at(d) for d, share in min_dim_shares)

    def blended_fp8_rate(self, min_dim_shares: tuple) -> float:
        """The fp8 GEMM rate of a set of GEMMs (as :meth:`blended_matmul_rate`): the fp8 rate
        itself, or with :attr:`fp8_by_size` that rate times the blended rate's share of the
        largest GEMMs' rate."""
        if not self.fp8_by_size or not self.matmul_size_rates or not min_dim_shares:
            return self.fp8_matmul_flops_per_s
        share = self.blended_matmul_rate(min_dim_shares) / self.matmul_size_rates[-1][1]
        return self.fp8_matmul_flops_per_s * share

    @property
    def usable_device_bytes(self) -> int:
        """Device bytes a step fits in: the compiler's limit where it has one, else capacity less
        the reserve."""
        return self.device_limit_bytes or hardware.usable_bytes(self.device_memory_bytes)


# XLA:TPU's latency-hiding scheduler keeps its schedule within this share of the device's memory
# (libtpu's xla_tpu_scheduler_percent_shared_memory_limit, 95 by default); where overlapping a
# copy would take the step past it, the scheduler issues the copy where it is consumed instead.
# The model's peak is held that far below it: XLA:TPU's peak exceeded the model's by up to this
# share on the v5e chip (bench/results/tpu_check.json's fit_margin; a test pins the two).
SCHEDULER_MEMORY_FRACTION = 0.95
PEAK_UNDERPREDICTION_TPU = 0.0318
SCHEDULER_SOURCE = (
    "XLA:TPU's latency-hiding scheduler keeps the schedule within 95 % of the memory limit "
    "(libtpu's xla_tpu_scheduler_percent_shared_memory_limit default, stated by the PyTorch/XLA "
    "maintainers in pytorch/xla#5736), less the model's largest under-prediction of XLA:TPU's "
    "peak on the v5e chip (3.2 %, bench/results/tpu_check.json); above it, deviceless compiles "
    "of the v5e dense case issue each prefetch where it is consumed "
    "(bench/results/tpu_copy_schedule.json)"
)


def installed_jaxlib() -> str:
    """The installed jaxlib's version: the release whose XLA compiles a program here."""
    return importlib.metadata.version("jaxlib")


def _release(jaxlib: str) -> tuple[int, ...]:
    """A jaxlib version's release numbers, e.g. "0.12.0.1" → (0, 12, 0, 1), "0.11.1.dev20260901"
    → (0, 11, 1)."""
    m = re.match(r"\d+(?:\.\d+)*", jaxlib.strip())
    if m is None:
        raise TieraxError(
            f"jaxlib version {jaxlib!r} is not a release number: give one such as 0.11.2 "
            "(XLA:GPU's GEMM workspace depends on the release)"
        )
    return tuple(int(p) for p in m.group(0).split("."))


def xla_gpu_fixed_bytes(compute_capability: Sequence[int], jaxlib: str) -> int:
    """The device bytes XLA:GPU allocates whatever the model, for a target of ``compute_capability``
    (major, minor) compiled by ``jaxlib``: its cuBLAS workspace at the step's peak (the comment on
    CUBLAS_WORKSPACE_BYTES says why).  32 MiB where the compile holds a dynamic-slice fusion's GEMM
    (jaxlib ≥ 0.11.1) on Hopper or later, else 4 MiB."""
    cc = tuple(compute_capability)
    if len(cc) != 2:
        raise TieraxError(
            f"compute capability {cc!r} is not (major, minor): give two numbers, e.g. (9, 0)"
        )
    release = _release(jaxlib)  # refused whatever the capability
    if cc >= HOPPER_CAPABILITY and release >= DYNAMIC_SLICE_FUSION_JAXLIB:
        return CUBLAS_HOPPER_WORKSPACE_BYTES
    return CUBLAS_WORKSPACE_BYTES


def xla_gpu_fixed_source(compute_capability: Sequence[int], jaxlib: str) -> str:
    """The rates line's source for :func:`xla_gpu_fixed_bytes`."""
    size = xla_gpu_fixed_bytes(compute_capability, jaxlib) // 2**20
    cc = ".".join(map(str, compute_capability))
    why = (
        "its size from compute capability 9.0 on, kept by the GEMMs of XLA's dynamic-slice "
        "fusions, which a deviceless autotuner leaves unresized"
        if size * 2**20 == CUBLAS_HOPPER_WORKSPACE_BYTES
        else "the size XLA's deviceless autotuner gives a cuBLASLt GEMM"
        if tuple(compute_capability) >= HOPPER_CAPABILITY
        else "its size before compute capability 9.0"
    )
    return (
        f"XLA:GPU's cuBLAS workspace, {size} MiB for compute capability {cc} under jaxlib {jaxlib} "
        f"({why}; NVIDIA's recommended workspace: cuBLAS documentation, cublasSetWorkspace)"
    )


def load_calibration() -> dict:
    """The calibration file's content (:func:`calibration_file`); empty where there is none."""
    path = calibration_file()
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            raise TieraxError(
                f"{path} is not valid JSON; delete it and run `tierax calibrate` again"
            ) from None
    return {}


def _cpu_rates(cal: dict, dtype: str) -> Rates:
    """The local CPU's rates from a ``tierax calibrate`` entry (``sources``: which are measured)."""
    measured = f"measured by tierax calibrate ({cal.get('created', '?')})"
    key = f"matmul_flops_per_s_{dtype}"
    if key not in cal and "matmul_flops_per_s" not in cal:
        raise TieraxError("target 'cpu' needs a measured matmul rate: run `tierax calibrate` first")
    matmul = cal.get(key, cal.get("matmul_flops_per_s"))
    sources = {
        "matmul": f"{measured}: {dtype} GEMM mix"
        if key in cal
        else f"{measured}, float32 only (an older file): run `tierax calibrate` again"
    }
    if "memory_bytes_per_s" in cal:
        bandwidth = cal["memory_bytes_per_s"]
        sources["hbm"] = f"{measured}: a layer's non-matmul work at the bytes the model counts"
    else:  # an older calibration file
        bandwidth = 10e9
        sources["hbm"] = "not measured: 10 GB/s assumed (run `tierax calibrate` again)"
    head = cal.get(f"head_matmul_flops_per_s_{dtype}", 0.0)
    sources["head_matmul"] = (
        f"{measured}: the LM head's GEMMs in the loss's form (float32 products of {dtype} operands)"
        if head
        else f"the {dtype} GEMM mix's rate (a {dtype} step's head GEMMs run the layers' kernel)"
        if dtype == "float32"
        else "not measured (an older file): the GEMM mix's rate (run `tierax calibrate` again)"
    )
    by_size = tuple((int(d), float(r)) for d, r in cal.get(f"matmul_size_rates_{dtype}", ()))
    sources["matmul_by_size"] = (
        f"{measured}: {dtype} GEMMs whose smallest dimension is "
        + ", ".join(str(d) for d, _ in by_size)
        + " (the largest: the GEMM mix), linear in log dimension between them"
        if by_size
        else "not measured: every GEMM at the mix's rate (run `tierax calibrate` again)"
    )
    first_touch = cal.get("first_touch_bytes_per_s", 0.0)
    sources["first_touch"] = (
        f"{measured}: first write of fresh memory (CPU-specific)"
        if first_touch
        else "not measured: not modelled (run `tierax calibrate` again)"
    )
    transpose = cal.get("transpose_read_elems_per_s", 0.0)
    aliased = cal.get("transpose_aliased_read_elems_per_s", 0.0)
    if transpose and aliased:
        sources["transposing_fusion"] = (
            f"{measured}: reads of XLA:CPU's slow transposing fusion, rows spread and rows a "
            "multiple of 4 KiB apart (CPU-specific)"
        )
    elif transpose:  # an older calibration file: aliased rows priced as spread ones
        aliased = transpose
        sources["transposing_fusion"] = (
            f"{measured}: reads of XLA:CPU's slow transposing fusion; rows a multiple of 4 KiB "
            "apart not measured, priced as spread rows (run `tierax calibrate` again)"
        )
    else:
        sources["transposing_fusion"] = "not measured: not modelled (run `tierax calibrate` again)"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    sources |= {"memory": "physical RAM", "offload": "a no-op on XLA:CPU"}
    return Rates(
        "cpu",
        matmul,
        bandwidth,
        1.0,
        1.0,
        1.0,
        mem,
        mem,
        False,
        sources,
        first_touch_bytes_per_s=first_touch,
        transpose_read_elems_per_s=transpose,
        transpose_aliased_read_elems_per_s=aliased,
        head_matmul_flops_per_s=head,
        matmul_size_rates=by_size,
    )


def target_rates(target: str, dtype: str, calibration: dict | None = None) -> Rates:
    """Rates for a GPU target from the hardware table and its published kernel rates, for a TPU
    target from the kernel rates measured on a TPU chip (:func:`_tpu_rates`), each replaced by a
    measured calibration of the target where there is one; or ``cpu`` measured here.

    ``calibration``: the calibration file's content to use instead of reading the file (a
    benchmark run's own calibration).
    """
    cal = (load_calibration() if calibration is None else calibration).get(target, {})
    if target == "cpu":
        return _cpu_rates(cal, dtype)
    spec = hardware.get_target(target)
    gpu = spec.kind == "gpu"
    if not gpu:
        return _tpu_rates(target, dtype, spec, cal)
    peak = spec.peak(dtype)
    matmul = cal.get(f"matmul_flops_per_s_{dtype}", peak * ACHIEVABLE_FRACTION)
    fp8_peak = spec.peak_flops.get("fp8", 0.0)
    fp8 = cal.get("matmul_flops_per_s_fp8", fp8_peak * ACHIEVABLE_FRACTION)
    d2h = cal.get("d2h_bytes_per_s", spec.host_link_bps)
    h2d = cal.get("h2d_bytes_per_s", spec.host_link_bps)
    measured = f"measured by tierax calibrate ({cal.get('created', '?')})"
    sources = {
        "matmul": measured
        if f"matmul_flops_per_s_{dtype}" in cal
        else f"{ACHIEVABLE_FRACTION:.0%} (an H200 measured 790/989) of the {peak / 1e12:.0f} "
        f"TFLOP/s {spec.peak_name(dtype)} datasheet peak",
        "host_link": measured if "d2h_bytes_per_s" in cal else spec.host_link_source,
        "hbm": "XLA device spec",
        "interconnect": "NVLink datasheet, per direction",
        "scale_out": spec.scale_out_source,
        "nvlink_domain": f"{spec.nvlink_domain_gpus} devices per NVLink/ICI domain",
        "memory": "XLA device spec",
        "host_memory": "system datasheet, per GPU",
    }
    hbm = cal.get("memory_bytes_per_s", spec.hbm_bytes_per_s)
    if "memory_bytes_per_s" in cal:
        sources["hbm"] = f"{measured}: a layer's non-matmul work at the bytes the model counts"
    jaxlib = installed_jaxlib()
    fixed = xla_gpu_fixed_bytes(spec.compute_capability, jaxlib)
    sources["fixed"] = xla_gpu_fixed_source(spec.compute_capability, jaxlib)
    sources["fused_attention"] = FUSED_ATTENTION_SOURCE
    fused_fwd = peak * FUSED_ATTENTION_FWD_FRACTION
    fused_bwd = peak * FUSED_ATTENTION_BWD_FRACTION
    if fp8:
        sources["fp8_matmul"] = (
            measured
            if "matmul_flops_per_s_fp8" in cal
            else FP8_SOURCE.format(fraction=ACHIEVABLE_FRACTION, peak=fp8_peak / 1e12)
        )
        if tuple(spec.compute_capability) >= (10, 0):
            sources["mxfp8_matmul"] = MXFP8_SOURCE
    sourced = _sourced_gpu(target, dtype, spec, peak, cal, sources)
    fused_fwd = sourced.get("fused_attention_fwd_flops_per_s", fused_fwd)
    fused_bwd = sourced.get("fused_attention_bwd_flops_per_s", fused_bwd)
    matmul = sourced.get("matmul_flops_per_s", matmul)
    fp8 = sourced.get("fp8_matmul_flops_per_s", fp8)
    host_bw = getattr(spec, "host_memory_bandwidth_bps", 0.0)
    if host_bw:
        sources["host_memory_bandwidth"] = spec.host_memory_bandwidth_source
    return Rates(
        target,
        matmul,
        hbm,
        d2h,
        h2d,
        spec.nvlink_bytes_per_s,
        spec.device_memory_bytes,
        int(spec.host_memory_per_gpu_bytes),
        True,
        sources,
        fixed,
        spec.nvlink_domain_gpus,
        spec.scale_out_bytes_per_s,
        fused_attention_fwd_flops_per_s=fused_fwd,
        fused_attention_bwd_flops_per_s=fused_bwd,
        host_memory_bytes_per_s=host_bw,
        fp8_matmul_flops_per_s=fp8,
        matmul_size_rates=sourced.get("matmul_size_rates", ()),
        overlap_slowdown=kernel_rates.OVERLAP_SLOWDOWN,
        fp8_by_size=bool(sourced.get("matmul_size_rates")) and "fp8_matmul_flops_per_s" in sourced,
        attention_by_shape=True,
    )


def _tpu_rates(target: str, dtype: str, spec, cal: dict) -> Rates:
    """A TPU target's rates: the kernel rates measured on a TPU chip (tierax.hardware.tpu_rates;
    another generation's scaled by this one's datasheet), each replaced by what a ``tierax
    calibrate`` entry ``cal`` measured on this target."""
    chip = tpu_rates.for_target(spec, dtype)
    sources = {
        "interconnect": "NVLink datasheet, per direction",
        "scale_out": spec.scale_out_source,
        "nvlink_domain": f"{spec.nvlink_domain_gpus} devices per NVLink/ICI domain",
        "host_link": spec.host_link_source,
    } | spec.rate_sources  # TPU targets name their own sources
    sources |= chip.sources
    measured = f"measured by tierax calibrate ({cal.get('created', '?')})"
    matmul, size_rates = chip.matmul, chip.size_rates
    if f"matmul_flops_per_s_{dtype}" in cal:
        matmul = cal[f"matmul_flops_per_s_{dtype}"]
        sources["matmul"] = measured
        # the measured shares by size keep their shape under the calibrated rate until the
        # calibration measures its own
        size_rates = tuple((d, r * matmul / size_rates[-1][1]) for d, r in size_rates)
        sources["matmul_by_size"] += f"; scaled to the rate {measured}"
    points = cal.get(f"matmul_size_rates_{dtype}", ())
    if points:
        size_rates = tuple((int(d), float(r)) for d, r in points)
        sources["matmul_by_size"] = (
            f"{measured}: {dtype} GEMMs whose smallest dimension is "
            + ", ".join(str(d) for d, _ in size_rates)
            + " (the largest: a step's GEMM mix), linear in log dimension between them"
        )
    table = chip.attention_table
    if cal.get("splash_attention"):
        table = tuple(tuple(r) for r in cal["splash_attention"])
        sources["fused_attention"] = (
            f"{measured}: the splash kernel forward and backward by (seq, head dim), linear in "
            "log seq and in head dim between the measured cases, the nearest beyond"
        )
    # a program of no known shape: the reference shape's, or the calibration's own default case
    fused_fwd, fused_bwd = attention_at(table, *kernel_rates.ATTENTION_REFERENCE)
    if "fused_attention_fwd_flops_per_s" in cal:
        fused_fwd = cal["fused_attention_fwd_flops_per_s"]
        fused_bwd = cal["fused_attention_bwd_flops_per_s"]
        if not cal.get("splash_attention"):  # an older calibration: one case, whatever the shape
            table = ()
            sources["fused_attention"] = f"{measured}: the splash kernel forward and backward"
    hbm = cal.get("memory_bytes_per_s", chip.hbm)
    if "memory_bytes_per_s" in cal:
        sources["hbm"] = f"{measured}: a layer's non-matmul work at the bytes the model counts"
    link = chip.host_link or spec.host_link_bps
    d2h = cal.get("d2h_bytes_per_s", link)
    h2d = cal.get("h2d_bytes_per_s", link)
    if "d2h_bytes_per_s" in cal:
        sources["host_link"] = measured
    # a TPU with fp8 MXU rates above its bf16 ones (v7x) prices fp8 GEMMs at them; one that lists
    # the same figure (v5p) gains nothing; one with none (v6e, v5e) runs them emulated
    fp8 = cal.get("matmul_flops_per_s_fp8", chip.fp8)
    if "matmul_flops_per_s_fp8" in cal:
        sources["fp8_matmul"] = measured
    index_s = cal.get("index_op_s", chip.index_op_s)
    scatter = cal.get("scatter_bytes_per_s", chip.scatter_bytes_per_s)
    if "index_op_s" in cal:
        sources["indexed"] = f"{measured}: an element gather per index, row scatter-adds"
    elif not index_s:
        sources["indexed"] = "not measured on this generation: gathers and scatters at their bytes"
    sources["memory_limit"] = spec.xla_hbm_limit_source
    sources["copy_overlap_limit"] = SCHEDULER_SOURCE
    tpu_lib = libtpu.installed_version()
    if libtpu.older_than_traced(tpu_lib):
        sources["libtpu"] = libtpu.OLDER_SOURCE.format(version=tpu_lib)
    return Rates(
        target,
        matmul,
        hbm,
        d2h,
        h2d,
        spec.nvlink_bytes_per_s,
        spec.device_memory_bytes,
        int(spec.host_memory_per_gpu_bytes),
        True,
        sources,
        0,
        spec.nvlink_domain_gpus,
        spec.scale_out_bytes_per_s,
        fused_attention_fwd_flops_per_s=fused_fwd,
        fused_attention_bwd_flops_per_s=fused_bwd,
        device_limit_bytes=spec.xla_hbm_limit_bytes,
        fp8_matmul_flops_per_s=fp8,
        libtpu=tpu_lib,
        matmul_size_rates=size_rates,
        fp8_by_size=bool(fp8) and "matmul_flops_per_s_fp8" not in cal,
        fused_attention_table=table,
        store_windows_by_name=True,
        host_state_shares_activations=False,
        index_op_s=index_s,
        scatter_bytes_per_s=scatter,
        scheduler_limit_bytes=int(
            SCHEDULER_MEMORY_FRACTION
            * (spec.xla_hbm_limit_bytes or spec.device_memory_bytes)
            / (1 + PEAK_UNDERPREDICTION_TPU)
        ),
    )


def _sourced_gpu(target: str, dtype: str, spec, peak: float, cal: dict, sources: dict) -> dict:
    """A GPU target's published kernel rates (tierax.hardware.kernel_rates) as Rates fields, their
    sources written into ``sources``: GEMMs by dtype and size where a sweep is published and no
    calibration file measured them, cuDNN's attention at the reference shape (the sustained-power
    factor of the target's architecture on it too, none where no sweep is published), and the
    interference of overlapped communication."""
    out: dict = {}
    g = kernel_rates.gemm(target, dtype, tuple(spec.compute_capability))
    sustained = 1.0
    if g is not None and f"matmul_flops_per_s_{dtype}" not in cal:
        sustained = g.sustained
        out["matmul_flops_per_s"] = g.matmul
        out["matmul_size_rates"] = g.size_rates
        sources["matmul"] = g.sources["matmul"]
        sources["matmul_by_size"] = g.sources["matmul_by_size"]
        if g.fp8 and "matmul_flops_per_s_fp8" not in cal:
            out["fp8_matmul_flops_per_s"] = g.fp8
            sources["fp8_matmul"] = g.sources["fp8_matmul"]
    elif g is None:
        sources["matmul"] += (
            f" (no published {dtype} sweep for {target}: the datasheet share, no sustained-power "
            "factor)"
        )
    fwd, bwd = kernel_rates.attention_shares(*kernel_rates.ATTENTION_REFERENCE)
    out["fused_attention_fwd_flops_per_s"] = peak * fwd * sustained
    out["fused_attention_bwd_flops_per_s"] = peak * bwd * sustained
    sources["fused_attention"] = kernel_rates.ATTENTION_SOURCE + (
        f", ×{sustained:.3f} sustained power as the GEMMs" if sustained != 1.0 else ""
    )
    sources["interference"] = kernel_rates.OVERLAP_SOURCE
    return out


def for_program(rates: Rates, prog) -> Rates:
    """``rates`` with the fused attention rates at ``prog``'s sequence length and head dimension
    (:func:`tierax.hardware.kernel_rates.attention_shares` over their value at the reference
    shape), where the target's rates follow the shape and ``prog`` runs a fused attention kernel;
    otherwise ``rates`` unchanged.  Idempotent: the result no longer follows the shape."""
    att = getattr(prog, "attention", None)
    if rates.fused_attention_table and att is not None:
        return _measured_attention(rates, prog.seq, att.qk_head_dim)
    if not rates.attention_by_shape or att is None:
        return rates
    f0, b0 = kernel_rates.attention_shares(*kernel_rates.ATTENTION_REFERENCE)
    f, b = kernel_rates.attention_shares(prog.seq, att.qk_head_dim)
    fwd = rates.fused_attention_fwd_flops_per_s * f / f0
    bwd = rates.fused_attention_bwd_flops_per_s * b / b0
    sources = dict(rates.sources)
    sources["fused_attention"] = (
        f"{sources.get('fused_attention', '')}; at sequence {prog.seq}, head dim "
        f"{att.qk_head_dim}: forward {fwd / 1e12:.0f}, backward {bwd / 1e12:.0f} TFLOP/s"
    )
    return dataclasses.replace(
        rates,
        fused_attention_fwd_flops_per_s=fwd,
        fused_attention_bwd_flops_per_s=bwd,
        attention_by_shape=False,
        sources=sources,
    )


def attention_at(table: Sequence, seq: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOP/s of a fused attention kernel measured by shape (``table``:
    ((seq, head dim, forward, backward), ...)) at ``seq`` and ``head_dim``: per measured head dim
    linear in log sequence between its measured lengths, then linear in head dim between the two
    measured head dims around ``head_dim``; the nearest measured point beyond either range."""
    by_dim: dict[int, list] = {}
    for s, d, f, b in table:
        by_dim.setdefault(int(d), []).append((s, f, b))
    at_dim = {}
    for d, rows in sorted(by_dim.items()):
        rows.sort()
        fwd = kernel_rates.interp(tuple((s, f) for s, f, _ in rows), seq)
        bwd = kernel_rates.interp(tuple((s, b) for s, _, b in rows), seq)
        at_dim[d] = (fwd, bwd)
    dims = tuple(sorted(at_dim))
    return tuple(
        kernel_rates.interp(tuple((d, at_dim[d][i]) for d in dims), head_dim, log=False)
        for i in (0, 1)
    )


def _measured_attention(rates: Rates, seq: int, head_dim: int) -> Rates:
    """``rates`` with the fused attention rates at (``seq``, ``head_dim``) from the kernel measured
    by shape (:attr:`Rates.fused_attention_table`, :func:`attention_at`)."""
    fwd, bwd = attention_at(rates.fused_attention_table, seq, head_dim)
    seqs = [r[0] for r in rates.fused_attention_table]
    dims = [r[1] for r in rates.fused_attention_table]
    beyond = [
        what
        for what, x, xs in (("sequence", seq, seqs), ("head dim", head_dim, dims))
        if not min(xs) <= x <= max(xs)
    ]
    sources = dict(rates.sources)
    sources["fused_attention"] = (
        f"{sources.get('fused_attention', '')}; at sequence {seq}, head dim {head_dim}: forward "
        f"{fwd / 1e12:.0f}, backward {bwd / 1e12:.0f} TFLOP/s"
        + (
            f" (the {' and '.join(beyond)} beyond the measured ones: the nearest's)"
            if beyond
            else ""
        )
    )
    return dataclasses.replace(
        rates,
        fused_attention_fwd_flops_per_s=fwd,
        fused_attention_bwd_flops_per_s=bwd,
        fused_attention_table=(),
        sources=sources,
    )


def indexed_s(indexed: tuple, rates: Rates) -> float:
    """Seconds of gathers and scatters given as (indices, scattered bytes)
    (:func:`tierax.tracing.hbm.phase_indexed`) beyond their bytes at HBM bandwidth: a cost per
    index and the scattered bytes at the scatter rate, where the target has them
    (:attr:`Rates.index_op_s`, :attr:`Rates.scatter_bytes_per_s`; 0: none)."""
    n, scattered = indexed
    rate = rates.scatter_bytes_per_s
    return n * rates.index_op_s + (scattered / rate if rate else 0.0)


def matmul_s(
    flops: float,
    fused_flops: float,
    rates: Rates,
    *,
    backward: bool = False,
    fp8_share: float = 0.0,
    min_dim_shares: tuple = (),
) -> float:
    """Seconds of ``flops`` forward matmul FLOPs (their backward's with ``backward``: 2 ×), of which
    ``fused_flops`` run in a fused attention kernel at its own rates (its backward: 2.5 ×) and a
    ``fp8_share`` of ``flops`` (at most the unfused ones) in fp8 GEMMs at the fp8 rate (a target
    without one: the compute dtype's rate, what emulated fp8 runs at); the rest at the rate of
    GEMMs whose smallest dimensions split their FLOPs as ``min_dim_shares``
    (:meth:`Rates.blended_matmul_rate`; the matmul rate where the target has no rates by size)."""
    if fp8_share and rates.fp8_matmul_flops_per_s > 0:
        f8 = min(fp8_share * flops, flops - fused_flops)
        f8_rate = rates.blended_fp8_rate(min_dim_shares)
        return (2 if backward else 1) * f8 / f8_rate + matmul_s(
            flops - f8, fused_flops, rates, backward=backward, min_dim_shares=min_dim_shares
        )
    rate = rates.blended_matmul_rate(min_dim_shares)
    if not fused_flops:
        return (2 if backward else 1) * flops / rate
    fused_rate = (
        rates.fused_attention_bwd_flops_per_s if backward else rates.fused_attention_fwd_flops_per_s
    )
    if fused_rate <= 0:
        raise TieraxError(
            f"attention=cudnn runs on CUDA GPUs only and attention=splash on TPUs; target "
            f"{rates.target!r} has no fused attention rate: use attention=blockwise there"
        )
    rest = (2 if backward else 1) * (flops - fused_flops) / rate
    return rest + (FUSED_BACKWARD_FLOPS_RATIO if backward else 1) * fused_flops / fused_rate


def fused_attention_s(fused_flops: float, rates: Rates, *, backward: bool = False) -> float:
    """The part of :func:`matmul_s` that ``fused_flops`` forward FLOPs of a fused attention kernel
    take (their backward's with ``backward``: 2.5 ×), at the kernel's own rate."""
    if not fused_flops:
        return 0.0
    rate = (
        rates.fused_attention_bwd_flops_per_s if backward else rates.fused_attention_fwd_flops_per_s
    )
    return (FUSED_BACKWARD_FLOPS_RATIO if backward else 1) * fused_flops / rate


# key → (Rates fields, unit factor, unit).  Bandwidths per direction.
RATE_KEYS: dict[str, tuple[tuple[str, ...], float, str]] = {
    "host_link": (("d2h_bytes_per_s", "h2d_bytes_per_s"), 1e9, "GB/s per direction, both ways"),
    "d2h": (("d2h_bytes_per_s",), 1e9, "GB/s device→host"),
    "h2d": (("h2d_bytes_per_s",), 1e9, "GB/s host→device"),
    "hbm_size": (("device_memory_bytes",), 1e9, "GB of device memory"),
    "hbm_bw": (("hbm_bytes_per_s",), 1e12, "TB/s of device memory bandwidth"),
    "matmul": (("matmul_flops_per_s",), 1e12, "TFLOP/s achievable matmul rate"),
    "fp8_matmul": (("fp8_matmul_flops_per_s",), 1e12, "TFLOP/s achievable fp8 GEMM rate"),
    "fused_attention_fwd": (
        ("fused_attention_fwd_flops_per_s",),
        1e12,
        "TFLOP/s of the fused attention forward",
    ),
    "fused_attention_bwd": (
        ("fused_attention_bwd_flops_per_s",),
        1e12,
        "TFLOP/s of the fused attention backward",
    ),
    "interconnect": (
        ("interconnect_bytes_per_s",),
        1e9,
        "GB/s per direction between devices of one NVLink domain",
    ),
    "scale_out": (
        ("scale_out_bytes_per_s",),
        1e9,
        "GB/s per direction per device between NVLink domains",
    ),
    "nvlink_domain": (("nvlink_domain_gpus",), 1, "devices per NVLink/ICI domain, a whole number"),
    "gpus_per_domain": (
        ("gpus_per_domain",),
        1,
        "this job's devices per domain, a whole number (default: spread evenly)",
    ),
    "host_memory": (("host_memory_bytes",), 1e9, "GB of host memory per device"),
}
INTEGER_KEYS = ("nvlink_domain", "gpus_per_domain")
# The ``Rates.sources`` entry each --rate key replaces, and whether it replaces all of it (False:
# one direction or pass of a pair, the other keeps its source).
SOURCE_KEYS: dict[str, tuple[str, bool]] = {
    "host_link": ("host_link", True),
    "d2h": ("host_link", False),
    "h2d": ("host_link", False),
    "hbm_size": ("memory", True),
    "hbm_bw": ("hbm", True),
    "matmul": ("matmul", True),
    "fp8_matmul": ("fp8_matmul", True),
    "fused_attention_fwd": ("fused_attention", False),
    "fused_attention_bwd": ("fused_attention", False),
    "interconnect": ("interconnect", True),
    "scale_out": ("scale_out", True),
    "nvlink_domain": ("nvlink_domain", True),
    "gpus_per_domain": ("gpus_per_domain", True),
    "host_memory": ("host_memory", True),
}
assert set(SOURCE_KEYS) == set(RATE_KEYS)


def _number(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise TieraxError(f"{what}: expected a finite number > 0, got {text!r}")
    return v


def _valid_rates() -> str:
    return ", ".join(f"{k} ({unit})" for k, (_, _, unit) in RATE_KEYS.items())


def override_rates(rates: Rates, overrides: Sequence[str]) -> Rates:
    """``rates`` with ``KEY=VALUE`` overrides applied in order; each override is named in
    ``sources``.

    Raises:
      TieraxError: no ``=``, an unknown key (the valid ones and their units are listed), a bad
          value.
    """
    for text in overrides:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep:
            raise TieraxError(
                f"--rate {text!r}: expected KEY=VALUE, e.g. --rate host_link=900; keys: "
                f"{_valid_rates()}"
            )
        if key not in RATE_KEYS:
            raise TieraxError(f"--rate {text!r}: unknown key {key!r}; valid keys: {_valid_rates()}")
        fields, factor, unit = RATE_KEYS[key]
        v = _number(value, f"--rate {text!r}") * factor
        if key in INTEGER_KEYS and v != int(v):
            raise TieraxError(
                f"--rate {text!r}: {key} counts devices; give a whole number ≥ 1, e.g. {key}=64"
            )
        changes = {
            f: (int(v) if f.endswith("memory_bytes") or key in INTEGER_KEYS else v) for f in fields
        }
        if key == "hbm_size":  # the compiler's limit was for the datasheet memory: the reserve rule
            changes["device_limit_bytes"] = 0
        if key.startswith("fused_attention"):  # the given rate, whatever the program's shape
            changes["attention_by_shape"] = False
            changes["fused_attention_table"] = ()
        if key == "matmul" and rates.matmul_size_rates:  # the rates by size keep their shape
            scale = v / rates.matmul_size_rates[-1][1]
            changes["matmul_size_rates"] = tuple((d, r * scale) for d, r in rates.matmul_size_rates)
        sources = dict(rates.sources)
        shown, whole = SOURCE_KEYS[key]
        text = f"--rate {key}={value.strip()} ({unit})"
        if not whole and shown in sources and not sources[shown].startswith(text):
            text = f"{text}; otherwise {sources[shown]}"  # one direction of a pair
        sources[shown] = text
        rates = dataclasses.replace(rates, **changes, sources=sources)
    return rates
