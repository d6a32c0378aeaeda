"""The four resources a step's predicted time is spent on (:class:`StepSplit`), and a target's rates
with each resource's time multiplied by a factor (:func:`scale_rates`): what a calibration from
measured runs fits and applies.

- ``gemm``: matmuls at the GEMM rates (the layers', the LM head's, fp8 GEMMs), forward, backward
  and recomputation;
- ``attention``: a fused attention kernel's matmuls (cuDNN's, splash's), the same three passes;
- ``memory``: non-matmul work at the HBM bandwidth (the layers' fusions, recomputed ones, the
  loss, the optimizer update, gradient accumulation);
- ``collectives``: the collectives the step waits for: those not hidden under compute, and the
  forward collectives a rematerialised layer repeats.

Everything else the step holds (exposed host copies, on a CPU the first touch of fresh memory and
XLA:CPU's transposing fusions, the exposed copies of offloaded training state) is ``other_s``:
no factor moves it.

A factor ``f`` of a resource divides that resource's rates by ``f``, so its seconds are multiplied
by ``f``.  The step time is linear in the factors of gemm, attention and memory; the exposed part
of the collectives (and of the host copies) is not: it is what compute does not hide, and compute
scales with the other factors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tierax.costmodel.rates import Rates
from tierax.errors import TieraxError

RESOURCES = ("gemm", "attention", "memory", "collectives")
# Rates fields each factor divides (bandwidths: both links of a collective).
RATE_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("matmul_flops_per_s", "fp8_matmul_flops_per_s", "head_matmul_flops_per_s"),
    "attention": ("fused_attention_fwd_flops_per_s", "fused_attention_bwd_flops_per_s"),
    "memory": ("hbm_bytes_per_s",),
    "collectives": ("interconnect_bytes_per_s", "scale_out_bytes_per_s"),
}


@dataclass(frozen=True)
class StepSplit:
    """A predicted step's seconds by resource; their sum is the step time."""

    gemm_s: float
    attention_s: float
    memory_s: float
    collective_s: float
    other_s: float

    def seconds(self, resource: str) -> float:
        """The seconds of ``resource`` (one of :data:`RESOURCES`)."""
        check_resources([resource], "resource")
        return {
            "gemm": self.gemm_s,
            "attention": self.attention_s,
            "memory": self.memory_s,
            "collectives": self.collective_s,
        }[resource]

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s + self.collective_s + self.other_s

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def check_resources(names, what: str) -> None:
    """Refuse a name that is not one of :data:`RESOURCES`."""
    unknown = [n for n in names if n not in RESOURCES]
    if unknown:
        raise TieraxError(
            f"{what}: unknown resource {', '.join(map(repr, unknown))}; choose from "
            f"{', '.join(RESOURCES)}"
        )


def scale_rates(rates: Rates, factors: Mapping[str, float], note: str | None = None) -> Rates:
    """``rates`` with each resource of ``factors`` (resource → factor > 0) taking ``factor`` × its
    seconds: its rates divided by the factor (``matmul_size_rates`` and
    ``fused_attention_table`` too).  ``note``: the
    ``sources`` entry ``calibration`` to set (None: none set).

    Raises:
      TieraxError: an unknown resource, or a factor that is not a finite number > 0.
    """
    check_resources(factors, "factors")
    changes: dict = {}
    for resource, f in factors.items():
        if isinstance(f, bool) or not isinstance(f, int | float) or not math.isfinite(f) or f <= 0:
            raise TieraxError(f"factor {resource}={f!r}: give a finite number > 0")
        for name in RATE_FIELDS[resource]:
            changes[name] = getattr(rates, name) / f
        if resource == "gemm" and rates.matmul_size_rates:
            changes["matmul_size_rates"] = tuple((d, r / f) for d, r in rates.matmul_size_rates)
        if resource == "attention" and rates.fused_attention_table:  # the kernel by shape too
            changes["fused_attention_table"] = tuple(
                (s, d, fwd / f, bwd / f) for s, d, fwd, bwd in rates.fused_attention_table
            )
    if note is not None:
        changes["sources"] = dict(rates.sources) | {"calibration": note}
    return dataclasses.replace(rates, **changes)
