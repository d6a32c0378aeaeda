"""Hardware facts for GPU and TPU targets, one table each, and GpuTargetConfigProto rendering.

Each figure names its source.  ``device_spec`` fields (SMs, clocks, memory size and
bandwidth, L2, compute capability, PCIe figure) are XLA's public device
specifications (``xla/backends/gpu/target_config/specs/``, Apache-2.0), as also
used in ``shared/gpu-targets``.  Peak FLOP/s are NVIDIA's datasheet dense (no
sparsity) figures.  Host-link bandwidths are per direction; ``host_link_bps`` is the
effective rate estimates use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from tierax.errors import TieraxError

GB = 1e9
# HGX/DGX H100, H200, B200: one NVLink domain per 8-GPU board; the compute fabric is 8 single-port ConnectX-7
# 400 Gb/s NICs, one per GPU (NVIDIA DGX H100/H200 user guide, DGX B200 datasheet) → 50 GB/s per direction.
_CX7_DGX = "ConnectX-7 400 Gb/s per GPU (NVIDIA DGX H100/H200 user guide, DGX B200 datasheet)"


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    device_memory_bytes: int
    sm_count: int
    clock_ghz: float
    mem_clock_khz: int
    hbm_bytes_per_s: float
    l2_bytes: int
    compute_capability: tuple[int, int]
    peak_flops: dict  # dtype -> dense FLOP/s
    host_link_theory_bps: float  # per direction
    host_link_bps: float  # per direction, effective (what estimates use)
    host_link_source: str
    host_memory_per_gpu_bytes: float
    pcie_bandwidth_field: int  # XLA spec's pcie_bandwidth value, copied as is
    interconnect_links: int  # NVLink links per GPU
    nvlink_bytes_per_s: float  # per direction, GPU↔GPU
    # GPUs one NVLink domain joins, and the scale-out network (NICs) per GPU per direction: a collective
    # whose group leaves the domain runs at that rate (tierax.network).
    nvlink_domain_gpus: int = 8
    scale_out_bytes_per_s: float = 0.0
    scale_out_source: str = ""
    # A projection: figures from announcements, not from a shipping part XLA describes.  No
    # deviceless compile is offered for it (XLA has no device spec); the cost model still runs.
    projection: str = ""
    kind: ClassVar[str] = "gpu"

    @property
    def xla_described(self) -> bool:
        return not self.projection

    def peak(self, dtype: str) -> float:
        key = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16"}.get(dtype, dtype)
        return self.peak_flops[key]


TARGETS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        key="h100", name="NVIDIA H100 80GB HBM3",
        # XLA spec h100_sxm: 84942979072 B, 132 SMs, 1.98 GHz, 3.35 TB/s, 50 MiB L2, sm_90a.
        device_memory_bytes=84942979072, sm_count=132, clock_ghz=1.98, mem_clock_khz=2619000,
        hbm_bytes_per_s=3352320000000, l2_bytes=52428800, compute_capability=(9, 0),
        # NVIDIA H100 SXM datasheet: 989 TF bf16, 1979 TF fp8, 494 TF tf32, 67 TF fp32 (dense).
        peak_flops={"bf16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12},
        # PCIe Gen5 x16: 64 GB/s per direction in theory; ~55 GB/s measured (DESIGN.md).
        host_link_theory_bps=64 * GB, host_link_bps=55 * GB, host_link_source="PCIe5 x16, measured ≈55 GB/s",
        # DGX H100: 2 TB system memory for 8 GPUs.
        host_memory_per_gpu_bytes=256 * GB, pcie_bandwidth_field=34359738368,
        # NVLink 4: 18 links, 900 GB/s bidirectional → 450 GB/s per direction.
        interconnect_links=18, nvlink_bytes_per_s=450 * GB,
        nvlink_domain_gpus=8, scale_out_bytes_per_s=50 * GB, scale_out_source=_CX7_DGX,
    ),
    "h200": GpuSpec(
        key="h200", name="NVIDIA H200 141GB HBM3e",
        # XLA spec h200: 151397597184 B, 132 SMs, 1.98 GHz, 4.8 TB/s, 50 MiB L2, sm_90a.
        device_memory_bytes=151397597184, sm_count=132, clock_ghz=1.98, mem_clock_khz=3750000,
        hbm_bytes_per_s=4800000000000, l2_bytes=52428800, compute_capability=(9, 0),
        # NVIDIA H200 datasheet: same tensor cores as H100 SXM.
        peak_flops={"bf16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12},
        host_link_theory_bps=64 * GB, host_link_bps=55 * GB, host_link_source="PCIe5 x16, measured ≈55 GB/s",
        # DGX H200: 2 TB system memory for 8 GPUs.
        host_memory_per_gpu_bytes=256 * GB, pcie_bandwidth_field=34359738368,
        interconnect_links=18, nvlink_bytes_per_s=450 * GB,
        nvlink_domain_gpus=8, scale_out_bytes_per_s=50 * GB, scale_out_source=_CX7_DGX,
    ),
    "b200": GpuSpec(
        key="b200", name="NVIDIA B200",
        # XLA spec b200: 191514411008 B, 148 SMs, 1.965 GHz, 7.67 TB/s, 126.5 MiB L2, sm_100a.
        device_memory_bytes=191514411008, sm_count=148, clock_ghz=1.965, mem_clock_khz=3996000,
        hbm_bytes_per_s=7672320000000, l2_bytes=132644864, compute_capability=(10, 0),
        # NVIDIA DGX B200 datasheet per GPU: 2.25 PF bf16, 4.5 PF fp8, 1.1 PF tf32, 75 TF fp32 (dense).
        peak_flops={"bf16": 2.25e15, "fp8": 4.5e15, "tf32": 1.1e15, "fp32": 75e12},
        # DGX B200 hosts attach GPUs over PCIe Gen5 x16: assume the H100/H200 measured rate.
        host_link_theory_bps=64 * GB, host_link_bps=55 * GB, host_link_source="PCIe5 x16 (DGX B200), assumed ≈55 GB/s",
        # DGX B200: 4 TB system memory (max configuration) for 8 GPUs; 2 TB base.
        host_memory_per_gpu_bytes=256 * GB, pcie_bandwidth_field=68719476736,
        # NVLink 5: 18 links, 1.8 TB/s bidirectional → 900 GB/s per direction.
        interconnect_links=18, nvlink_bytes_per_s=900 * GB,
        nvlink_domain_gpus=8, scale_out_bytes_per_s=50 * GB, scale_out_source=_CX7_DGX,
    ),
    "gb200": GpuSpec(
        key="gb200", name="NVIDIA GB200",
        # XLA spec gb200: 197897748480 B, 152 SMs, 2.062 GHz, 7.93 TB/s, 129 MiB L2, sm_100a.
        device_memory_bytes=197897748480, sm_count=152, clock_ghz=2.062, mem_clock_khz=3996000,
        hbm_bytes_per_s=7928064000000, l2_bytes=135528448, compute_capability=(10, 0),
        # NVIDIA GB200 NVL72 datasheet per GPU: 2.5 PF bf16, 5 PF fp8, 1.25 PF tf32, 80 TF fp32 (dense).
        peak_flops={"bf16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12},
        # NVLink-C2C: 900 GB/s bidirectional = 450 GB/s per direction in theory;
        # ≈185 GB/s device→host measured by one public user report (DESIGN.md).
        host_link_theory_bps=450 * GB, host_link_bps=185 * GB, host_link_source="NVLink-C2C, measured ≈185 GB/s D2H",
        # GB200 superchip: one Grace with 480 GB LPDDR5X per two GPUs.
        host_memory_per_gpu_bytes=240 * GB, pcie_bandwidth_field=2147483648,
        interconnect_links=18, nvlink_bytes_per_s=900 * GB,
        # GB200 NVL72: 72 GPUs in one NVLink domain; DGX GB200 datasheet: 72 single-port ConnectX-7 400 Gb/s
        # (one per GPU; CX7 in each compute tray, NVIDIA multi-node NVLink tuning guide) → 50 GB/s per direction.
        nvlink_domain_gpus=72, scale_out_bytes_per_s=50 * GB, scale_out_source="ConnectX-7 400 Gb/s per GPU (DGX GB200)",
    ),
}


# What-if targets for the cost model (simulate, plan), marked as projections.  Fields only XLA's
# GpuTargetConfigProto needs (SM count, clocks, L2, PCIe field) are GB200's: they are never rendered,
# since `tierax compile` refuses a projection.
TARGETS["gb300"] = GpuSpec(
    key="gb300", name="NVIDIA GB300 (projection)",
    # NVIDIA GB300 NVL72 product page: 288 GB HBM3e and 8 TB/s per Blackwell Ultra GPU.
    device_memory_bytes=288 * 10**9, sm_count=160, clock_ghz=2.062, mem_clock_khz=3996000,
    hbm_bytes_per_s=8e12, l2_bytes=135528448, compute_capability=(10, 3),
    # NVIDIA GB300 NVL72 datasheet per GPU, dense: 2.5 PF bf16, 5 PF fp8, 1.25 PF tf32, 80 TF fp32
    # (rack: 360 PF fp8 dense / 72 GPUs = 5 PF).
    peak_flops={"bf16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12},
    # Same Grace + NVLink-C2C (900 GB/s bidirectional) as GB200: GB200's measured ≈185 GB/s assumed.
    host_link_theory_bps=450 * GB, host_link_bps=185 * GB,
    host_link_source="NVLink-C2C as GB200 (900 GB/s bidirectional); GB200's measured ≈185 GB/s assumed",
    # GB300 NVL72: 40 TB "fast memory" = 20.7 TB HBM3e + ≈18 TB Grace LPDDR5X over 72 GPUs.
    host_memory_per_gpu_bytes=250 * GB, pcie_bandwidth_field=2147483648,
    interconnect_links=18, nvlink_bytes_per_s=900 * GB,
    # NVIDIA GB300 NVL72 enterprise reference architecture: 72 GPUs per NVLink domain; each compute tray has
    # 4 ConnectX-8 SuperNICs (800 Gb/s), one per GPU → 100 GB/s per direction.
    nvlink_domain_gpus=72, scale_out_bytes_per_s=100 * GB, scale_out_source="ConnectX-8 800 Gb/s per GPU (GB300 NVL72 RA)",
    projection="GB300 NVL72 announced figures (NVIDIA GTC 2025 / product page); no XLA device spec in jaxlib 0.10.2",
)
TARGETS["vr200"] = GpuSpec(
    key="vr200", name="NVIDIA Vera Rubin VR200 (projection)",
    # NVIDIA GTC 2025 (Vera Rubin NVL144): 288 GB HBM4 per Rubin GPU package, 13 TB/s HBM4.
    device_memory_bytes=288 * 10**9, sm_count=160, clock_ghz=2.062, mem_clock_khz=3996000,
    hbm_bytes_per_s=13e12, l2_bytes=135528448, compute_capability=(10, 3),
    # NVIDIA GTC 2025: NVL144 = 1.2 EF fp8 for training over 72 Rubin packages → 16.7 PF fp8 each;
    # bf16 = fp8 / 2 as on Blackwell (derived, not announced); tf32 = bf16 / 2, fp32 as GB300.
    peak_flops={"bf16": 8.33e15, "fp8": 16.7e15, "tf32": 4.17e15, "fp32": 80e12},
    # Vera CPU ↔ Rubin NVLink-C2C: 1.8 TB/s bidirectional (NVIDIA) = 900 GB/s per direction; effective
    # assumed at GB200's measured/theoretical ratio (185/450) until someone measures it.
    host_link_theory_bps=900 * GB, host_link_bps=900 * GB * 185 / 450,
    host_link_source="NVLink-C2C 1.8 TB/s bidirectional (NVIDIA); effective at GB200's measured 185/450 ratio",
    # Vera: up to 1.5 TB LPDDR5X (SOCAMM) per CPU, two Rubin packages per Vera CPU.
    host_memory_per_gpu_bytes=750 * GB, pcie_bandwidth_field=2147483648,
    # NVLink 6: 3.6 TB/s bidirectional per GPU (NVIDIA GTC 2025).
    interconnect_links=18, nvlink_bytes_per_s=1800 * GB,
    # NVIDIA GTC 2025: NVL144 = 72 Rubin packages in one NVLink domain; ConnectX-9 1.6 Tb/s per GPU → 200 GB/s.
    nvlink_domain_gpus=72, scale_out_bytes_per_s=200 * GB, scale_out_source="ConnectX-9 1.6 Tb/s per GPU (GTC 2025)",
    projection="Vera Rubin NVL144 announced figures (NVIDIA GTC 2025); bf16 derived from fp8; not shipping",
)


@dataclass(frozen=True)
class TpuSpec:
    """A Cloud TPU generation: per-chip figures (one JAX device per chip for v5e, v5p and v6e).

    Attribute names the cost model reads are shared with :class:`GpuSpec` (``device_memory_bytes``,
    ``hbm_bytes_per_s``, ``peak``, ``host_link_bps``, ``host_link_source``, and the aliases
    ``nvlink_bytes_per_s`` (= ICI per direction) and ``host_memory_per_gpu_bytes`` (= per chip)).
    """

    key: str
    name: str
    generation: str  # libtpu's topology prefix: "v5e" in "v5e:2x2"
    device_memory_bytes: int
    hbm_bytes_per_s: float
    peak_flops: dict  # dtype -> dense FLOP/s per chip
    host_link_theory_bps: float  # per direction
    host_link_bps: float  # per direction, what estimates use
    host_link_source: str
    host_memory_per_chip_bytes: float
    ici_bytes_per_s: float  # per direction, per chip (Google lists bidirectional; halved here)
    slice_shapes: tuple[str, ...]  # Google Cloud's supported slice topologies, smallest first
    # ICI joins the chips of a slice, and a slice lies in one pod: the pod is the domain; DCN beyond it (0: unknown).
    nvlink_domain_gpus: int = 256
    scale_out_bytes_per_s: float = 0.0
    scale_out_source: str = "no per-chip DCN figure sourced yet; give --rate scale_out=GB/s"
    projection: str = ""
    kind: ClassVar[str] = "tpu"
    rate_sources: ClassVar[dict] = {"hbm": "Google Cloud TPU docs", "memory": "Google Cloud TPU docs",
                                    "interconnect": "ICI, Google Cloud TPU docs (bidirectional / 2)",
                                    "host_memory": "Google Cloud TPU docs, host DRAM / chips per host"}

    @property
    def xla_described(self) -> bool:
        return not self.projection

    @property
    def nvlink_bytes_per_s(self) -> float:  # the cost model's interconnect field
        return self.ici_bytes_per_s

    @property
    def host_memory_per_gpu_bytes(self) -> float:  # the cost model's host-memory field
        return self.host_memory_per_chip_bytes

    def peak(self, dtype: str) -> float:
        # XLA:TPU runs float32 matmuls at DEFAULT precision as bf16 MXU passes: the bf16 peak.
        key = {"float32": "bf16", "bfloat16": "bf16", "float16": "bf16"}.get(dtype, dtype)
        return self.peak_flops[key]

    def chips(self, shape: str) -> int:
        n = 1
        for d in shape.split("x"):
            n *= int(d)
        return n

    def topology_name(self, devices: int) -> str:
        """libtpu's topology name for a slice of ``devices`` chips, e.g. v5e 4 → "v5e:2x2".

        Raises:
          TieraxError: no supported slice shape has that many chips (the message lists the counts).
        """
        for shape in self.slice_shapes:
            if self.chips(shape) == devices:
                return f"{self.generation}:{shape}"
        counts = ", ".join(str(self.chips(s)) for s in self.slice_shapes)
        raise TieraxError(f"target {self.key!r} has no TPU slice of {devices} chips; --devices must be one of: "
                          f"{counts} (Google Cloud's {self.generation} slice shapes "
                          f"{', '.join(self.slice_shapes)})")


# Host link: Google Cloud does not publish a host↔TPU bandwidth per direction; the JAX scaling book
# ("How to Scale Your Model", ch. "All about TPUs", jax-ml.github.io/scaling-book) uses ≈1.5e10 B/s for
# PCIe between host and TPU.  That figure is used for every generation until `tierax calibrate` measures one.
_TPU_HOST_LINK = 15 * GB
_TPU_HOST_LINK_SOURCE = "PCIe ≈15 GB/s per direction (JAX scaling book; no per-generation Google figure)"
_V5E_V6E_SHAPES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

TPU_TARGETS: dict[str, TpuSpec] = {
    "v5e": TpuSpec(
        key="v5e", name="Cloud TPU v5e", generation="v5e",
        # docs.cloud.google.com/tpu/docs/v5e: 16 GB HBM2 at 819 GBps, 197 TFLOPs bf16, 393 TOPs int8 per chip.
        device_memory_bytes=16 * 10**9, hbm_bytes_per_s=819 * GB,
        peak_flops={"bf16": 197e12, "int8": 393e12},
        host_link_theory_bps=_TPU_HOST_LINK, host_link_bps=_TPU_HOST_LINK, host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 512 GiB DRAM per host, 8 chips per host → 64 GiB per chip.
        host_memory_per_chip_bytes=512 * 2**30 / 8,
        # same page: 400 GBps bidirectional ICI per chip → 200 GB/s per direction.
        ici_bytes_per_s=200 * GB,
        # same page: supported 2D slice shapes 1x1 … 16x16 (256-chip pod).
        slice_shapes=_V5E_V6E_SHAPES,
        # same page: TPU Pod size 256 chips; per-host NIC 2 × 100 Gbps for 8 chips → 25 Gb/s = 3.125 GB/s per chip.
        scale_out_bytes_per_s=3.125 * GB, scale_out_source="DCN 2×100 Gb/s per 8-chip host (Cloud TPU v5e docs)",
    ),
    "v5p": TpuSpec(
        key="v5p", name="Cloud TPU v5p", generation="v5p",
        # docs.cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e at 2765 GBps, 459 TFLOPs bf16 per chip.
        device_memory_bytes=95 * 2**30, hbm_bytes_per_s=2765 * GB,
        peak_flops={"bf16": 459e12, "fp8": 459e12},
        host_link_theory_bps=_TPU_HOST_LINK, host_link_bps=_TPU_HOST_LINK, host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 448 GB RAM per 4-chip VM → 112 GB per chip.
        host_memory_per_chip_bytes=448 * GB / 4,
        # same page: 1200 GBps bidirectional ICI per chip → 600 GB/s per direction.
        ici_bytes_per_s=600 * GB,
        # same page: common single-slice shapes, 2x2x1 (4 chips) … 16x16x24 (6144 chips).
        slice_shapes=("2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16",
                      "16x16x16", "16x16x24"),
        nvlink_domain_gpus=8960,  # same page: 8960 chips in a v5p pod
    ),
    "v6e": TpuSpec(
        key="v6e", name="Cloud TPU v6e (Trillium)", generation="v6e",
        # docs.cloud.google.com/tpu/docs/v6e: 32 GB HBM at 1638 GBps, 918 TFLOPs bf16, 1836 TOPs int8 per chip;
        # each chip reaches its host over PCIe Gen5.
        device_memory_bytes=32 * 10**9, hbm_bytes_per_s=1638 * GB,
        peak_flops={"bf16": 918e12, "int8": 1836e12},
        host_link_theory_bps=_TPU_HOST_LINK, host_link_bps=_TPU_HOST_LINK, host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 1536 GiB DRAM per host, 8 chips per host → 192 GiB per chip.
        host_memory_per_chip_bytes=1536 * 2**30 / 8,
        # same page: 800 GBps bidirectional ICI per chip → 400 GB/s per direction.
        ici_bytes_per_s=400 * GB,
        # same page: 2D slice shapes as v5e, 1x1 … 16x16 (256-chip pod).
        slice_shapes=_V5E_V6E_SHAPES,
    ),
}


# "Fits" everywhere (plan, simulate, compile) means peak ≤ capacity × (1 − this): memory the runtime
# takes beside XLA's buffers (NCCL buffers, cuBLAS/cuDNN workspaces, allocator fragmentation).  A stated
# assumption, not a measurement: it matches the 0.95 cap tierax puts on XLA_PYTHON_CLIENT_MEM_FRACTION.
RUNTIME_RESERVE_FRACTION = 0.05


def usable_bytes(capacity_bytes: float) -> int:
    """Device bytes a step may use: capacity less :data:`RUNTIME_RESERVE_FRACTION`."""
    return int(capacity_bytes * (1 - RUNTIME_RESERVE_FRACTION))


def get_target(key: str) -> GpuSpec | TpuSpec:
    if key in TARGETS:
        return TARGETS[key]
    if key in TPU_TARGETS:
        return TPU_TARGETS[key]
    raise TieraxError(f"unknown target {key!r}; choose one of: {', '.join([*TARGETS, *TPU_TARGETS])}")


def compile_target(key: str) -> GpuSpec | TpuSpec:
    """A target XLA describes (deviceless compile needs its device spec).

    Raises:
      TieraxError: unknown, or a projection (the cost model still accepts it).
    """
    spec = get_target(key)
    if not spec.xla_described:
        described = ", ".join(k for k, t in [*TARGETS.items(), *TPU_TARGETS.items()] if t.xla_described)
        raise TieraxError(f"target {key!r} is a projection ({spec.projection}): XLA has no device spec for it, so "
                          f"no compile is claimed; compile for one of {described}, or use `tierax simulate/plan "
                          f"--target {key}`")
    return spec


# XLA:GPU's latency-hiding scheduler and HLO rematerialisation work within a memory limit:
# (the module's device_memory_size − argument/output bytes) × a slop factor.  On a real GPU,
# JAX sets device_memory_size to the allocator's limit (XLA_PYTHON_CLIENT_MEM_FRACTION of
# the memory); a deviceless compile has no allocator, so XLA takes 80 % of the target's
# memory instead (gpu_hlo_schedule.cc, GetSchedulerMemoryLimit).  For a step whose weights
# and optimizer state fill most of the device, that leaves the scheduler no room to overlap
# any host copy: every transfer serialises, which a real run would not do.
XLA_DEVICELESS_MEMORY_FRACTION = 0.8


def scheduling_target_config(text: str) -> str:
    """``text`` (a GpuTargetConfigProto) with its memory restated for a deviceless compile.

    ``device_memory_size`` becomes usable_bytes(memory) / 0.8, so that XLA's 80 % is exactly
    the budget a run under tierax's runtime reserve gets from the allocator on the real
    device; nothing else reads the field in a deviceless compile, and every memory figure
    tierax reports or checks uses the target's real capacity.
    """
    m = re.search(r"^(\s*device_memory_size:\s*)(\d+)\s*$", text, flags=re.M)
    if m is None:
        raise TieraxError("the target config has no gpu_device_info.device_memory_size; add the device's memory "
                          "in bytes (see shared/gpu-targets/README.md)")
    stated = int(usable_bytes(int(m.group(2))) / XLA_DEVICELESS_MEMORY_FRACTION)
    return text[: m.start(2)] + str(stated) + text[m.end(2):]


def render_target_config(spec: GpuSpec, *, cuda: tuple[int, int, int] = (13, 0, 0), cudnn: tuple[int, int, int] = (9, 10, 0)) -> str:
    """GpuTargetConfigProto text for ``jax.experimental.topologies.get_topology_desc``.

    The fields are the ones jaxlib 0.10.2 accepts (see shared/gpu-targets/README.md).
    """
    major, minor = spec.compute_capability
    cc = f"{major}.{minor}a"
    cuda_s = ".".join(map(str, cuda))
    model = (
        f"sm_{cc} with {spec.device_memory_bytes}B RAM, {spec.sm_count} cores, "
        f"{round(spec.clock_ghz * 1e6)}KHz clock, {spec.mem_clock_khz}KHz mem clock, {spec.l2_bytes}B L2$"
    )
    cc_minor = f"\n    minor: {minor}" if minor else ""
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {spec.sm_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(spec.hbm_bytes_per_s)}
  l2_cache_size: {spec.l2_bytes}
  clock_rate_ghz: {spec.clock_ghz}
  device_memory_size: {spec.device_memory_bytes}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: {major}{cc_minor}
    feature_extension: ACCELERATED_FEATURES
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  device_vendor: "NVIDIA Corporation"
  platform_version: "Compute Capability {cc}"
  model_str: "{model}"
  device_address_bits: 64
  pcie_bandwidth: {spec.pcie_bandwidth_field}
  ecc_enabled: true
  name: "{spec.name}"
  driver_version: "{cuda_s}"
  runtime_version: "{cuda_s}"
  compile_time_toolkit_version: "{cuda_s}"
  dnn_version: "{".".join(map(str, cudnn))}"
  device_interconnect_info {{
    active_links: {spec.interconnect_links}
  }}
}}
platform_name: "CUDA"
dnn_version_info {{
  major: {cudnn[0]}
  minor: {cudnn[1]}
  patch: {cudnn[2]}
}}
runtime_version {{
  major: {cuda[0]}
  minor: {cuda[1]}
  patch: {cuda[2]}
}}
device_description_str: "{spec.name}"
"""
