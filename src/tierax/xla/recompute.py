"""XLA's own recomputation: what its rematerialization pass added to a compiled program.

Where a program's live values exceed the memory XLA schedules within, its HLO rematerialization
pass (``HloRematerialization``) clones instructions so that a value is computed again where it is
used instead of held: the clones carry the original's name with a ``.remat`` suffix (``.remat2``,
``.remat3``… where one is cloned again), and each runs on top of the compute the plan asked for.
A plan whose peak sits at the compiler's limit is therefore not the program the cost model priced:
it holds less than the plan keeps and computes more than the plan recomputes.  This module finds
those clones in a scheduled module and prices them as the static overlap check prices compute
(:func:`tierax.xla.hlo.instruction_seconds`, each computation's executions per step).

``tierax compile`` reports the figure beside its prediction; ``plan --check`` takes recompute beyond
its tolerance of the step as a plan above the compiler's room and re-plans below it
(:mod:`tierax.solving.plan_check`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tierax.xla import hlo

# The suffix XLA's rematerialization pass gives its clones (a clone of a clone counts up).
_CLONE = re.compile(r"\.remat\d*$")


@dataclass(frozen=True)
class Recomputed:
    name: str  # the clone's instruction name (e.g. fusion.388.remat2)
    computation: str
    executions: int  # per step (loop trip counts multiplied)
    flops: float  # matmul FLOPs of one execution
    seconds: float  # all executions, at the replay's rates

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "computation": self.computation,
            "executions": self.executions,
            "flops": self.flops,
            "seconds": self.seconds,
        }


def is_clone(name: str) -> bool:
    """Whether an HLO instruction name is one XLA's rematerialization pass gave a clone."""
    return _CLONE.search(name) is not None


def recomputed(
    module: hlo.Module,
    *,
    peak_flops: float,
    hbm_bytes_per_s: float,
    kernel_s: Callable[[hlo.Module, hlo.Instruction], float | None] | None = None,
) -> list[Recomputed]:
    """Every rematerialization clone of a scheduled module, priced per step, largest first."""
    executions = module.executions()
    out = []
    for cname, instrs in module.computations.items():
        for ins in instrs:
            if not is_clone(ins.name):
                continue
            n = executions.get(cname, 1)
            once = hlo.instruction_seconds(
                module,
                ins,
                peak_flops=peak_flops,
                hbm_bytes_per_s=hbm_bytes_per_s,
                kernel_s=kernel_s,
            )
            out.append(Recomputed(ins.name, cname, n, module.instruction_flops(ins), once * n))
    return sorted(out, key=lambda r: -r.seconds)


def compiled_step_s(predicted_step_s: float, recompute_s: float, load_excess_s: float) -> float:
    """The model's step with what XLA's compiled program adds to it: its own recompute and the
    host loads its schedule exposes beyond the model's (none taken back where it exposes less)."""
    return predicted_step_s + recompute_s + max(0.0, load_excess_s)


def summary(clones: list[Recomputed], *, top: int = 5) -> dict:
    """The ``xla_recompute`` object of ``tierax compile --json``: totals and the costliest
    clones."""
    return {
        "instructions": len(clones),
        "flops": sum(r.flops * r.executions for r in clones),
        "est_s": sum(r.seconds for r in clones),
        "largest": [r.to_json() for r in clones[:top]],
    }
