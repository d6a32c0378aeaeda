"""Cloud TPU targets: :class:`TpuSpec` and the TPU table (Google Cloud TPU docs), each figure with
its source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tierax.errors import TieraxError
from tierax.hardware.gpus import GB


@dataclass(frozen=True)
class TpuSpec:
    """A Cloud TPU generation: per-device figures.  v5e, v5p and v6e have one JAX device per chip
    (v5p's two TensorCores act as one megacore device), so there a device's figures are the chip's;
    TPU7x (Ironwood) shows each of a chip's two TensorCores as its own JAX device
    (``devices_per_chip`` 2), so its table row holds the chip's published figures divided by 2.

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
    host_memory_per_chip_bytes: float  # per JAX device (per chip but for TPU7x)
    ici_bytes_per_s: float  # per direction, per chip (Google lists bidirectional; halved here)
    slice_shapes: tuple[str, ...]  # Google Cloud's supported slice topologies, smallest first
    # The HBM one program may use, as XLA:TPU states it when it refuses one ("exceeds available
    # HBM (N G)"): it assigns every buffer at compile time, so this is the limit a step fits in
    # (see xla_hbm_limit_source).
    xla_hbm_limit_bytes: int = 0
    # ICI joins the chips of a slice, and a slice lies in one pod: the pod is the domain; DCN beyond
    # it (0: unknown).
    nvlink_domain_gpus: int = 256
    scale_out_bytes_per_s: float = 0.0
    scale_out_source: str = "no per-chip DCN figure sourced yet; give --rate scale_out=GB/s"
    projection: str = ""
    # JAX devices a chip shows (2 for TPU7x: one per TensorCore); ``--devices`` counts these.
    devices_per_chip: int = 1
    kind: ClassVar[str] = "tpu"
    xla_hbm_limit_source: ClassVar[str] = (
        "XLA:TPU's available HBM, from libtpu's out-of-memory message in a deviceless compile "
        "(libtpu 0.0.42.1, 0.0.50.1 and 0.0.52; the lowest where they differ; tests/test_tpu.py "
        "checks the installed libtpu's)"
    )
    rate_sources: ClassVar[dict] = {
        "hbm": "Google Cloud TPU docs",
        "memory": "Google Cloud TPU docs",
        "interconnect": "ICI, Google Cloud TPU docs (bidirectional / 2)",
        "host_memory": "Google Cloud TPU docs, host DRAM / devices per host",
    }

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

    def peak_name(self, dtype: str) -> str:
        """Which datasheet peak :meth:`peak` gives for ``dtype``, for the rates' source notes."""
        same = dtype == "bfloat16"
        return "bf16" + ("" if same else f" ({dtype} matmuls run as bf16 MXU passes)")

    def accelerator_type(self, devices: int) -> str:
        """Google Cloud's accelerator type of a slice of ``devices`` JAX devices: the count is
        TensorCores (v5p and TPU7x: 2 a chip; v5p's pair is one device, TPU7x's are two)."""
        prefix, cores = {
            "v5e": ("v5litepod", 1),
            "v5p": ("v5p", 2),
            "v6e": ("v6e", 1),
            "tpu7x": ("tpu7x", 2),
        }[self.generation]
        return f"{prefix}-{devices // self.devices_per_chip * cores}"

    def chips(self, shape: str) -> int:
        n = 1
        for d in shape.split("x"):
            n *= int(d)
        return n

    def topology_name(self, devices: int) -> str:
        """libtpu's topology name for a slice of ``devices`` JAX devices, e.g. v5e 4 → "v5e:2x2",
        v7x 8 (4 chips × 2 TensorCores) → "tpu7x:2x2x1".

        Raises:
          TieraxError: no supported slice shape has that many devices (the message lists the
            counts).
        """
        per = self.devices_per_chip
        for shape in self.slice_shapes:
            if self.chips(shape) * per == devices:
                return f"{self.generation}:{shape}"
        counts = ", ".join(str(self.chips(s) * per) for s in self.slice_shapes)
        unit = "chips" if per == 1 else f"devices ({per} TensorCores, each a JAX device, a chip)"
        raise TieraxError(
            f"target {self.key!r} has no TPU slice of {devices} {unit}; --devices must be one of: "
            f"{counts} (Google Cloud's {self.generation} slice shapes "
            f"{', '.join(self.slice_shapes)})"
        )


# Host link: Google Cloud does not publish a host↔TPU bandwidth per direction; the JAX scaling book
# ("How to Scale Your Model", ch. "All about TPUs", jax-ml.github.io/scaling-book) uses ≈1.5e10 B/s
# for PCIe between host and TPU.  That figure is used for every generation until `tierax calibrate`
# measures one.
_TPU_HOST_LINK = 15 * GB
_TPU_HOST_LINK_SOURCE = (
    "PCIe ≈15 GB/s per direction (JAX scaling book; no per-generation Google figure)"
)


def _gib(figure: float) -> int:
    """Bytes of a libtpu figure: its "G" is GiB (tests/test_tpu.py: a 1.2e11-byte buffer pair reads
    111.76G)."""
    return int(figure * 2**30)


_V5E_V6E_SHAPES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

TPU_TARGETS: dict[str, TpuSpec] = {
    "v5e": TpuSpec(
        key="v5e",
        name="Cloud TPU v5e",
        generation="v5e",
        # docs.cloud.google.com/tpu/docs/v5e: 16 GB HBM2 at 819 GBps, 197 TFLOPs bf16, 393 TOPs int8
        # per chip.  The HBM "GB" is GiB, like v5p's 95 GiB: XLA:TPU gives one program 15.75 GiB
        # (xla_hbm_limit_bytes), more than 16e9 bytes (14.9 GiB) could hold.
        device_memory_bytes=16 * 2**30,
        hbm_bytes_per_s=819 * GB,
        xla_hbm_limit_bytes=_gib(15.75),
        peak_flops={"bf16": 197e12, "int8": 393e12},
        host_link_theory_bps=_TPU_HOST_LINK,
        host_link_bps=_TPU_HOST_LINK,
        host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 512 GiB DRAM per host, 8 chips per host → 64 GiB per chip.
        host_memory_per_chip_bytes=512 * 2**30 / 8,
        # same page: 400 GBps bidirectional ICI per chip → 200 GB/s per direction.
        ici_bytes_per_s=200 * GB,
        # same page: supported 2D slice shapes 1x1 … 16x16 (256-chip pod).
        slice_shapes=_V5E_V6E_SHAPES,
        # same page: TPU Pod size 256 chips; per-host NIC 2 × 100 Gbps for 8 chips → 25 Gb/s = 3.125
        # GB/s per chip.
        scale_out_bytes_per_s=3.125 * GB,
        scale_out_source="DCN 2×100 Gb/s per 8-chip host (Cloud TPU v5e docs)",
    ),
    "v5p": TpuSpec(
        key="v5p",
        name="Cloud TPU v5p",
        generation="v5p",
        # docs.cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e at 2765 GBps, 459 TFLOPs bf16 per chip.
        # libtpu: 95.74G (0.0.42.1), 95.73G (0.0.52) available to one program, more than 95 GiB:
        # the chip holds 96 GiB (capacity is never below what XLA:TPU hands out).
        device_memory_bytes=96 * 2**30,
        hbm_bytes_per_s=2765 * GB,
        xla_hbm_limit_bytes=_gib(95.73),
        peak_flops={"bf16": 459e12, "fp8": 459e12},
        host_link_theory_bps=_TPU_HOST_LINK,
        host_link_bps=_TPU_HOST_LINK,
        host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 448 GB RAM per 4-chip VM → 112 GB per chip.
        host_memory_per_chip_bytes=448 * GB / 4,
        # same page: 1200 GBps bidirectional ICI per chip → 600 GB/s per direction.
        ici_bytes_per_s=600 * GB,
        # same page: common single-slice shapes, 2x2x1 (4 chips) … 16x16x24 (6144 chips).
        slice_shapes=(
            "2x2x1",
            "2x2x2",
            "2x4x4",
            "4x4x4",
            "4x4x8",
            "4x8x8",
            "8x8x8",
            "8x8x16",
            "8x16x16",
            "16x16x16",
            "16x16x24",
        ),
        nvlink_domain_gpus=8960,  # same page: 8960 chips in a v5p pod
        # same page: "Data center network (DCN) bandwidth per chip (Gbps): 50" → 6.25 GB/s; a
        # multi-slice job's collectives between slices run over it.
        scale_out_bytes_per_s=50e9 / 8,
        scale_out_source="DCN 50 Gb/s per chip (Cloud TPU v5p docs)",
    ),
    "v6e": TpuSpec(
        key="v6e",
        name="Cloud TPU v6e (Trillium)",
        generation="v6e",
        # docs.cloud.google.com/tpu/docs/v6e: 32 GB HBM at 1638 GBps, 918 TFLOPs bf16, 1836 TOPs
        # int8 per chip; each chip reaches its host over PCIe Gen5.  The HBM "GB" is GiB (as v5e):
        # XLA:TPU gives one program 31.24 GiB (libtpu 0.0.50.1; 31.25 under 0.0.42.1), more than
        # 32e9 bytes (29.8 GiB) could hold.
        device_memory_bytes=32 * 2**30,
        hbm_bytes_per_s=1638 * GB,
        xla_hbm_limit_bytes=_gib(31.24),
        peak_flops={"bf16": 918e12, "int8": 1836e12},
        host_link_theory_bps=_TPU_HOST_LINK,
        host_link_bps=_TPU_HOST_LINK,
        host_link_source=_TPU_HOST_LINK_SOURCE,
        # same page: 1536 GiB DRAM per host, 8 chips per host → 192 GiB per chip.
        host_memory_per_chip_bytes=1536 * 2**30 / 8,
        # same page: 800 GBps bidirectional ICI per chip → 400 GB/s per direction.
        ici_bytes_per_s=400 * GB,
        # same page: 2D slice shapes as v5e, 1x1 … 16x16 (256-chip pod).
        slice_shapes=_V5E_V6E_SHAPES,
        # same page: per-host NIC 4 × 200 Gbps for 8 chips → 100 Gb/s = 12.5 GB/s per chip (the
        # page's "Data center network bandwidth per Pod", 25.6 Tbps over 256 chips, is the same
        # 100 Gb/s); a multi-slice job's collectives between slices run over it.
        scale_out_bytes_per_s=100e9 / 8,
        scale_out_source="DCN 4×200 Gb/s per 8-chip host (Cloud TPU v6e docs)",
    ),
}

# TPU7x (Ironwood), per chip, Google Cloud TPU docs (docs.cloud.google.com/tpu/docs/tpu7x, "System
# architecture" table): 2307 TFLOP/s bf16 and 4614 TFLOP/s fp8 peak, 192 GiB HBM at 7380 GB/s,
# 1200 GB/s bidirectional ICI, 100 Gb/s DCN, 960 GB RAM per 4-chip VM, 2 TensorCores a chip, 9216
# chips a pod.  The same page: the programming model shows the chip's two TensorCores as two JAX
# devices (not one megacore), and libtpu's "tpu7x:2x2x1" topology has 8 devices for its 4 chips.
# Each device gets half of each per-chip figure; the ICI and DCN links are the chip's, shared by
# its two devices (the die-to-die link between them is not modelled).
_V7X_DEVICES_PER_CHIP = 2
_V7X_CHIP = dict(
    bf16=2307e12,
    fp8=4614e12,
    hbm=192 * 2**30,
    hbm_bw=7380 * GB,
    ici_bidir=1200 * GB,
    dcn=100e9 / 8,  # 100 Gb/s → 12.5 GB/s
    host_mem=960 * GB / 4,
    pod_chips=9216,
)

TPU_TARGETS["v7x"] = TpuSpec(
    key="v7x",
    name="Cloud TPU7x (Ironwood)",
    generation="tpu7x",  # libtpu's prefix ("v7x:2x2x1" is refused: "Invalid TPU external name")
    devices_per_chip=_V7X_DEVICES_PER_CHIP,
    device_memory_bytes=_V7X_CHIP["hbm"] // _V7X_DEVICES_PER_CHIP,
    hbm_bytes_per_s=_V7X_CHIP["hbm_bw"] / _V7X_DEVICES_PER_CHIP,
    # libtpu 0.0.50.1: "exceeds available HBM (94.74G)" for one tpu7x device (96 GiB less reserve;
    # 94.75G under 0.0.42.1).
    xla_hbm_limit_bytes=_gib(94.74),
    peak_flops={
        "bf16": _V7X_CHIP["bf16"] / _V7X_DEVICES_PER_CHIP,
        "fp8": _V7X_CHIP["fp8"] / _V7X_DEVICES_PER_CHIP,
    },
    host_link_theory_bps=_TPU_HOST_LINK,
    host_link_bps=_TPU_HOST_LINK,
    host_link_source=_TPU_HOST_LINK_SOURCE,
    host_memory_per_chip_bytes=_V7X_CHIP["host_mem"] / _V7X_DEVICES_PER_CHIP,
    # bidirectional → per direction, then shared by the chip's two devices.
    ici_bytes_per_s=_V7X_CHIP["ici_bidir"] / 2 / _V7X_DEVICES_PER_CHIP,
    # Slice shapes: 2x2x1, 2x2x2, 2x2x4, 2x4x4, then 4-multiples in cubes of 4x4x4 (Google's xpk,
    # system_characteristics.generate_tpu_topologies, which it uses for tpu7x); libtpu 0.0.42.1
    # accepts each listed here.
    slice_shapes=(
        "2x2x1",
        "2x2x2",
        "2x2x4",
        "2x4x4",
        "4x4x4",
        "4x4x8",
        "4x8x8",
        "8x8x8",
        "8x8x16",
        "8x16x16",
        "16x16x16",
    ),
    nvlink_domain_gpus=_V7X_CHIP["pod_chips"] * _V7X_DEVICES_PER_CHIP,
    scale_out_bytes_per_s=_V7X_CHIP["dcn"] / _V7X_DEVICES_PER_CHIP,
    scale_out_source="DCN 100 Gb/s per chip, shared by its 2 devices (Cloud TPU7x docs)",
)
