"""GPU targets: :class:`GpuSpec` and the GPU table (XLA device specs, NVIDIA datasheets, announced
projections), each figure with its source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

GB = 1e9
# What one scale-out NIC carries for NCCL, as a share of its line rate: "For NDR @ 400Gbps you
# should see 46-48GB/s per NIC" (an NCCL maintainer, NVIDIA/nccl-tests issue 290), the low end of
# that over 50 GB/s.  A collective group that leaves its NVLink domain runs over as many NICs as it
# has devices in each domain (tierax.costmodel.network).
NIC_EFFICIENCY = 46 / 50
_NIC_SOURCE = "NCCL per NIC: 46 of 50 GB/s (NCCL maintainer, nccl-tests#290)"
# HGX/DGX H100, H200, B200: one NVLink domain per 8-GPU board; the compute fabric is 8 single-port
# ConnectX-7 400 Gb/s NICs, one per GPU (NVIDIA DGX H100/H200 user guide, DGX B200 datasheet) → 50
# GB/s line rate per direction.
_CX7_DGX = (
    "ConnectX-7 400 Gb/s per GPU (NVIDIA DGX H100/H200 user guide, DGX B200 datasheet); "
    + _NIC_SOURCE
)


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
    # GPUs one NVLink domain joins, and the scale-out network (NICs) per GPU per direction: a
    # collective whose group leaves the domain runs at that rate (tierax.costmodel.network).
    nvlink_domain_gpus: int = 8
    scale_out_bytes_per_s: float = 0.0
    scale_out_source: str = ""
    # A projection: figures from announcements, not from a shipping part XLA describes.  No
    # deviceless compile is offered for it (XLA has no device spec); the cost model still runs.
    projection: str = ""
    # The host's memory bandwidth per GPU (its CPUs' DRAM bandwidth over the GPUs they serve): the
    # rate an optimizer update run on the host would read and write its state at.  0: not known.
    host_memory_bandwidth_bps: float = 0.0
    host_memory_bandwidth_source: str = ""
    kind: ClassVar[str] = "gpu"

    @property
    def xla_described(self) -> bool:
        return not self.projection

    def peak(self, dtype: str) -> float:
        key = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16"}.get(dtype, dtype)
        return self.peak_flops[key]

    def peak_name(self, dtype: str) -> str:
        """Which datasheet peak :meth:`peak` gives for ``dtype``, for the rates' source notes."""
        return dtype


TARGETS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        key="h100",
        name="NVIDIA H100 80GB HBM3",
        # XLA spec h100_sxm: 84942979072 B, 132 SMs, 1.98 GHz, 3.35 TB/s, 50 MiB L2, sm_90a.
        device_memory_bytes=84942979072,
        sm_count=132,
        clock_ghz=1.98,
        mem_clock_khz=2619000,
        hbm_bytes_per_s=3352320000000,
        l2_bytes=52428800,
        compute_capability=(9, 0),
        # NVIDIA H100 SXM datasheet: 989 TF bf16, 1979 TF fp8, 494 TF tf32, 67 TF fp32 (dense).
        peak_flops={"bf16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12},
        # PCIe Gen5 x16: 64 GB/s per direction in theory; ~55 GB/s in public pinned-memory copy
        # measurements (bench/gpu_check.py measures the device at hand).
        host_link_theory_bps=64 * GB,
        host_link_bps=55 * GB,
        host_link_source="PCIe5 x16, measured ≈55 GB/s",
        # DGX H100: 2 TB system memory for 8 GPUs.
        host_memory_per_gpu_bytes=256 * GB,
        pcie_bandwidth_field=34359738368,
        # NVLink 4: 18 links, 900 GB/s bidirectional → 450 GB/s per direction.
        interconnect_links=18,
        nvlink_bytes_per_s=450 * GB,
        nvlink_domain_gpus=8,
        scale_out_bytes_per_s=50 * GB * NIC_EFFICIENCY,
        scale_out_source=_CX7_DGX,
        # DGX H100/H200: 2 Intel Xeon Platinum 8480C, each 8 channels of DDR5-4800 (NVIDIA DGX
        # H100/H200 user guide; Intel ARK) = 2 × 307.2 GB/s for 8 GPUs.
        host_memory_bandwidth_bps=2 * 8 * 38.4 * GB / 8,
        host_memory_bandwidth_source="2 Xeon 8480C × 8 channels DDR5-4800 (DGX H100/H200 user "
        "guide, Intel ARK) / 8 GPUs",
    ),
    "h200": GpuSpec(
        key="h200",
        name="NVIDIA H200 141GB HBM3e",
        # XLA spec h200: 151397597184 B, 132 SMs, 1.98 GHz, 4.8 TB/s, 50 MiB L2, sm_90a.
        device_memory_bytes=151397597184,
        sm_count=132,
        clock_ghz=1.98,
        mem_clock_khz=3750000,
        hbm_bytes_per_s=4800000000000,
        l2_bytes=52428800,
        compute_capability=(9, 0),
        # NVIDIA H200 datasheet: same tensor cores as H100 SXM.
        peak_flops={"bf16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12},
        host_link_theory_bps=64 * GB,
        host_link_bps=55 * GB,
        host_link_source="PCIe5 x16, measured ≈55 GB/s",
        # DGX H200: 2 TB system memory for 8 GPUs.
        host_memory_per_gpu_bytes=256 * GB,
        pcie_bandwidth_field=34359738368,
        interconnect_links=18,
        nvlink_bytes_per_s=450 * GB,
        nvlink_domain_gpus=8,
        scale_out_bytes_per_s=50 * GB * NIC_EFFICIENCY,
        scale_out_source=_CX7_DGX,
        # DGX H100/H200: 2 Intel Xeon Platinum 8480C, each 8 channels of DDR5-4800 (NVIDIA DGX
        # H100/H200 user guide; Intel ARK) = 2 × 307.2 GB/s for 8 GPUs.
        host_memory_bandwidth_bps=2 * 8 * 38.4 * GB / 8,
        host_memory_bandwidth_source="2 Xeon 8480C × 8 channels DDR5-4800 (DGX H100/H200 user "
        "guide, Intel ARK) / 8 GPUs",
    ),
    "b200": GpuSpec(
        key="b200",
        name="NVIDIA B200",
        # XLA spec b200: 191514411008 B, 148 SMs, 1.965 GHz, 7.67 TB/s, 126.5 MiB L2, sm_100a.
        device_memory_bytes=191514411008,
        sm_count=148,
        clock_ghz=1.965,
        mem_clock_khz=3996000,
        hbm_bytes_per_s=7672320000000,
        l2_bytes=132644864,
        compute_capability=(10, 0),
        # NVIDIA DGX B200 datasheet per GPU: 2.25 PF bf16, 4.5 PF fp8, 1.1 PF tf32, 75 TF fp32
        # (dense).
        peak_flops={"bf16": 2.25e15, "fp8": 4.5e15, "tf32": 1.1e15, "fp32": 75e12},
        # DGX B200 hosts attach GPUs over PCIe Gen5 x16: assume the H100/H200 measured rate.
        host_link_theory_bps=64 * GB,
        host_link_bps=55 * GB,
        host_link_source="PCIe5 x16 (DGX B200), assumed ≈55 GB/s",
        # DGX B200: 4 TB system memory (max configuration) for 8 GPUs; 2 TB base.
        host_memory_per_gpu_bytes=256 * GB,
        pcie_bandwidth_field=68719476736,
        # NVLink 5: 18 links, 1.8 TB/s bidirectional → 900 GB/s per direction.
        interconnect_links=18,
        nvlink_bytes_per_s=900 * GB,
        nvlink_domain_gpus=8,
        scale_out_bytes_per_s=50 * GB * NIC_EFFICIENCY,
        scale_out_source=_CX7_DGX,
        # DGX B200: 2 Intel Xeon Platinum 8570, each 8 channels of DDR5-5600 (NVIDIA DGX B200
        # datasheet; Intel ARK) = 2 × 358.4 GB/s for 8 GPUs.
        host_memory_bandwidth_bps=2 * 8 * 44.8 * GB / 8,
        host_memory_bandwidth_source="2 Xeon 8570 × 8 channels DDR5-5600 (DGX B200 datasheet, "
        "Intel ARK) / 8 GPUs",
    ),
    "gb200": GpuSpec(
        key="gb200",
        name="NVIDIA GB200",
        # XLA spec gb200: 197897748480 B, 152 SMs, 2.062 GHz, 7.93 TB/s, 129 MiB L2, sm_100a.
        device_memory_bytes=197897748480,
        sm_count=152,
        clock_ghz=2.062,
        mem_clock_khz=3996000,
        hbm_bytes_per_s=7928064000000,
        l2_bytes=135528448,
        compute_capability=(10, 0),
        # NVIDIA GB200 NVL72 datasheet per GPU: 2.5 PF bf16, 5 PF fp8, 1.25 PF tf32, 80 TF fp32
        # (dense).
        peak_flops={"bf16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12},
        # NVLink-C2C: 900 GB/s bidirectional = 450 GB/s per direction in theory;
        # ≈185 GB/s device→host measured in one public user report.
        host_link_theory_bps=450 * GB,
        host_link_bps=185 * GB,
        host_link_source="NVLink-C2C, measured ≈185 GB/s D2H",
        # GB200 superchip: one Grace with 480 GB LPDDR5X per two GPUs.
        host_memory_per_gpu_bytes=240 * GB,
        pcie_bandwidth_field=2147483648,
        interconnect_links=18,
        nvlink_bytes_per_s=900 * GB,
        # GB200 NVL72: 72 GPUs in one NVLink domain; DGX GB200 datasheet: 72 single-port ConnectX-7
        # 400 Gb/s (one per GPU; CX7 in each compute tray, NVIDIA multi-node NVLink tuning guide) →
        # 50 GB/s per direction.
        nvlink_domain_gpus=72,
        scale_out_bytes_per_s=50 * GB * NIC_EFFICIENCY,
        scale_out_source="ConnectX-7 400 Gb/s per GPU (DGX GB200); " + _NIC_SOURCE,
        # GB200 NVL72 datasheet: up to 17 TB of LPDDR5X at up to 18.4 TB/s over its 36 Grace CPUs,
        # one Grace per two GPUs → 18.4 TB/s / 72 per GPU.
        host_memory_bandwidth_bps=18.4e12 / 72,
        host_memory_bandwidth_source="Grace LPDDR5X: 18.4 TB/s over 72 GPUs (GB200 NVL72 "
        "datasheet)",
    ),
}


# What-if targets for the cost model (simulate, plan), marked as projections.  Fields only XLA's
# GpuTargetConfigProto needs (SM count, clocks, L2, PCIe field) are GB200's: they are never
# rendered, since `tierax compile` refuses a projection.
TARGETS["gb300"] = GpuSpec(
    key="gb300",
    name="NVIDIA GB300 (projection)",
    # NVIDIA GB300 NVL72 product page: 288 GB HBM3e and 8 TB/s per Blackwell Ultra GPU.
    device_memory_bytes=288 * 10**9,
    sm_count=160,
    clock_ghz=2.062,
    mem_clock_khz=3996000,
    hbm_bytes_per_s=8e12,
    l2_bytes=135528448,
    compute_capability=(10, 3),
    # NVIDIA GB300 NVL72 datasheet per GPU, dense: 2.5 PF bf16, 5 PF fp8, 1.25 PF tf32, 80 TF fp32
    # (rack: 360 PF fp8 dense / 72 GPUs = 5 PF).
    peak_flops={"bf16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12},
    # Same Grace + NVLink-C2C (900 GB/s bidirectional) as GB200: GB200's measured ≈185 GB/s assumed.
    host_link_theory_bps=450 * GB,
    host_link_bps=185 * GB,
    host_link_source="NVLink-C2C as GB200 (900 GB/s bidirectional); GB200's measured ≈185 GB/s "
    "assumed",
    # GB300 NVL72: 40 TB "fast memory" = 20.7 TB HBM3e + ≈18 TB Grace LPDDR5X over 72 GPUs.
    host_memory_per_gpu_bytes=250 * GB,
    pcie_bandwidth_field=2147483648,
    interconnect_links=18,
    nvlink_bytes_per_s=900 * GB,
    # NVIDIA GB300 NVL72 enterprise reference architecture: 72 GPUs per NVLink domain; each compute
    # tray has 4 ConnectX-8 SuperNICs (800 Gb/s), one per GPU → 100 GB/s per direction.
    nvlink_domain_gpus=72,
    scale_out_bytes_per_s=100 * GB * NIC_EFFICIENCY,
    scale_out_source="ConnectX-8 800 Gb/s per GPU (GB300 NVL72 RA) at CX7's measured share",
    # The same Grace CPUs as GB200: GB200 NVL72's 18.4 TB/s of LPDDR5X over 72 GPUs assumed.
    host_memory_bandwidth_bps=18.4e12 / 72,
    host_memory_bandwidth_source="Grace LPDDR5X as GB200 (18.4 TB/s over 72 GPUs), assumed",
    projection="GB300 NVL72 announced figures (NVIDIA GTC 2025 / product page); no XLA device spec "
    "in jaxlib 0.10.2",
)
TARGETS["vr200"] = GpuSpec(
    key="vr200",
    name="NVIDIA Vera Rubin VR200 (projection)",
    # NVIDIA GTC 2025 (Vera Rubin NVL144): 288 GB HBM4 per Rubin GPU package, 13 TB/s HBM4.
    device_memory_bytes=288 * 10**9,
    sm_count=160,
    clock_ghz=2.062,
    mem_clock_khz=3996000,
    hbm_bytes_per_s=13e12,
    l2_bytes=135528448,
    compute_capability=(10, 3),
    # NVIDIA GTC 2025: NVL144 = 1.2 EF fp8 for training over 72 Rubin packages → 16.7 PF fp8 each;
    # bf16 = fp8 / 2 as on Blackwell (derived, not announced); tf32 = bf16 / 2, fp32 as GB300.
    peak_flops={"bf16": 8.33e15, "fp8": 16.7e15, "tf32": 4.17e15, "fp32": 80e12},
    # Vera CPU ↔ Rubin NVLink-C2C: 1.8 TB/s bidirectional (NVIDIA) = 900 GB/s per direction;
    # effective assumed at GB200's measured/theoretical ratio (185/450) until someone measures it.
    host_link_theory_bps=900 * GB,
    host_link_bps=900 * GB * 185 / 450,
    host_link_source="NVLink-C2C 1.8 TB/s bidirectional (NVIDIA); effective at GB200's measured "
    "185/450 ratio",
    # Vera: up to 1.5 TB LPDDR5X (SOCAMM) per CPU, two Rubin packages per Vera CPU.
    host_memory_per_gpu_bytes=750 * GB,
    pcie_bandwidth_field=2147483648,
    # NVLink 6: 3.6 TB/s bidirectional per GPU (NVIDIA GTC 2025).
    interconnect_links=18,
    nvlink_bytes_per_s=1800 * GB,
    # NVIDIA GTC 2025: NVL144 = 72 Rubin packages in one NVLink domain; ConnectX-9 1.6 Tb/s per GPU
    # → 200 GB/s.
    nvlink_domain_gpus=72,
    scale_out_bytes_per_s=200 * GB * NIC_EFFICIENCY,
    scale_out_source="ConnectX-9 1.6 Tb/s per GPU (GTC 2025) at CX7's measured share",
    projection="Vera Rubin NVL144 announced figures (NVIDIA GTC 2025); bf16 derived from fp8; not "
    "shipping",
)
