"""XLA:GPU target-config rendering: a GpuTargetConfigProto for a GPU target, and its memory restated
for a
deviceless compile's scheduler."""

from __future__ import annotations

import re

from tierax.errors import TieraxError
from tierax.hardware.gpus import GpuSpec
from tierax.hardware.targets import usable_bytes

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
        raise TieraxError(
            "the target config has no gpu_device_info.device_memory_size; add "
            "`device_memory_size: BYTES` (the device's memory) under gpu_device_info in the file "
            "given as --target-config"
        )
    stated = int(usable_bytes(int(m.group(2))) / XLA_DEVICELESS_MEMORY_FRACTION)
    return text[: m.start(2)] + str(stated) + text[m.end(2) :]


def render_target_config(
    spec: GpuSpec,
    *,
    cuda: tuple[int, int, int] = (13, 0, 0),
    cudnn: tuple[int, int, int] = (9, 10, 0),
) -> str:
    """GpuTargetConfigProto text for ``jax.experimental.topologies.get_topology_desc``.

    The fields are the ones jaxlib 0.10.2 accepts: XLA's device specification less the fields its
    proto rejects (``collective_memory_granularity``, ``cub_version``) and the optional per-dtype
    rate tables; tests/test_compile.py compares the output with tests/fixtures/gpu-targets/.
    """
    major, minor = spec.compute_capability
    cc = f"{major}.{minor}a"
    cuda_s = ".".join(map(str, cuda))
    model = (
        f"sm_{cc} with {spec.device_memory_bytes}B RAM, {spec.sm_count} cores, "
        f"{round(spec.clock_ghz * 1e6)}KHz clock, {spec.mem_clock_khz}KHz mem clock, "
        f"{spec.l2_bytes}B L2$"
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
