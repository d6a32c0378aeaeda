"""Hardware facts for GPU and TPU targets, one table each, and GpuTargetConfigProto rendering.

Each figure names its source.  ``device_spec`` fields (SMs, clocks, memory size and
bandwidth, L2, compute capability, PCIe figure) are XLA's public device
specifications (``xla/backends/gpu/target_config/specs/``, Apache-2.0; the rendered
configs are in ``tests/fixtures/gpu-targets``).  Peak FLOP/s are NVIDIA's datasheet dense (no
sparsity) figures.  Host-link bandwidths are per direction; ``host_link_bps`` is the
effective rate estimates use.
"""

from tierax.hardware.gpus import GB, TARGETS, GpuSpec
from tierax.hardware.targets import (
    RUNTIME_RESERVE_FRACTION,
    compile_target,
    fit_limit_bytes,
    get_target,
    platform,
    usable_bytes,
)
from tierax.hardware.tpus import TPU_TARGETS, TpuSpec

__all__ = [
    "GB",
    "RUNTIME_RESERVE_FRACTION",
    "TARGETS",
    "TPU_TARGETS",
    "XLA_DEVICELESS_MEMORY_FRACTION",
    "GpuSpec",
    "TpuSpec",
    "compile_target",
    "fit_limit_bytes",
    "get_target",
    "platform",
    "render_target_config",
    "scheduling_target_config",
    "usable_bytes",
]

# tierax.hardware.target_config imports this package, so its names load on first use.
_TARGET_CONFIG = (
    "XLA_DEVICELESS_MEMORY_FRACTION",
    "render_target_config",
    "scheduling_target_config",
)


def __getattr__(name: str):
    if name in _TARGET_CONFIG:
        from tierax.hardware import target_config

        return getattr(target_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
