"""Looking a target up by key (every target, or one XLA can compile for) and the runtime reserve
that
"fits" leaves."""

from __future__ import annotations

from tierax.errors import TieraxError
from tierax.hardware.gpus import TARGETS, GpuSpec
from tierax.hardware.tpus import TPU_TARGETS, TpuSpec

# "Fits" everywhere (plan, simulate, compile) means peak ≤ capacity × (1 − this): memory the runtime
# takes beside XLA's buffers (NCCL buffers, cuBLAS/cuDNN workspaces, allocator fragmentation).  A
# stated assumption, not a measurement: it matches the 0.95 cap tierax puts on
# XLA_PYTHON_CLIENT_MEM_FRACTION.
RUNTIME_RESERVE_FRACTION = 0.05


def usable_bytes(capacity_bytes: float) -> int:
    """Device bytes a step may use: capacity less :data:`RUNTIME_RESERVE_FRACTION`."""
    return int(capacity_bytes * (1 - RUNTIME_RESERVE_FRACTION))


def fit_limit_bytes(spec) -> int:
    """Device bytes a step may use on ``spec``: on a TPU, XLA:TPU's own limit (it assigns every
    buffer at compile time and refuses a program over it, so nothing beside it needs a reserve); on
    a GPU, capacity less :data:`RUNTIME_RESERVE_FRACTION`."""
    return getattr(spec, "xla_hbm_limit_bytes", 0) or usable_bytes(spec.device_memory_bytes)


def get_target(key: str) -> GpuSpec | TpuSpec:
    if key in TARGETS:
        return TARGETS[key]
    if key in TPU_TARGETS:
        return TPU_TARGETS[key]
    raise TieraxError(
        f"unknown target {key!r}; choose one of: {', '.join([*TARGETS, *TPU_TARGETS])}"
    )


def platform(key: str) -> str:
    """The platform a target's step runs on: ``gpu``, ``tpu``, or ``cpu`` (the calibrated local
    target); what ``attention: auto`` is chosen for (tierax.models.for_platform).

    Raises:
      TieraxError: an unknown target.
    """
    return "cpu" if key == "cpu" else get_target(key).kind


def compile_target(key: str) -> GpuSpec | TpuSpec:
    """A target XLA describes (deviceless compile needs its device spec).

    Raises:
      TieraxError: unknown, or a projection (the cost model still accepts it).
    """
    every = [*TARGETS.items(), *TPU_TARGETS.items()]
    described = ", ".join(k for k, t in every if t.xla_described)
    if key == "cpu":  # a valid target elsewhere (calibrated local rates), so not "unknown" here
        raise TieraxError(
            "target 'cpu' is this machine's measured rates, for simulate and plan; "
            f"a deviceless compile needs a GPU or TPU target: {described}"
        )
    spec = get_target(key)
    if not spec.xla_described:
        raise TieraxError(
            f"target {key!r} is a projection ({spec.projection}): XLA has no device spec for it, "
            f"so no compile is claimed; compile for one of {described}, or use `tierax "
            f"simulate/plan --target {key}`"
        )
    return spec
