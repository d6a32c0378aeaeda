"""``tierax plan --check``: solve, compile the chosen plan deviceless, correct the model, re-solve.

The cost model predicts the peak from its terms; XLA's compiled program is the truth for the target.
Each iteration compiles the plan the planner chose for the target (XLA:GPU or XLA:TPU, no device),
compares XLA's peak with the prediction and the static overlap check's exposed transfer time with
the predicted exposure, and, if the plan does not fit or the peak disagrees by more than the
tolerance, corrects the one term the comparison can attribute and solves again:

* **workspace** — XLA's peak minus the model's.  Every other memory term is exact by construction
  (parameter/optimizer shards, and each kept or offloaded activation's bytes come from the same
  shapes XLA compiles: ``compile`` checks the offloaded ones on the host), so the difference is the
  transient memory of the program the model does not see (fusion temporaries, collective buffers,
  copies); it is independent of the placements, so the re-solve sees a budget smaller by it.
* **exposed time** is compared and reported, not corrected: the static check and the model use the
  same link rates, and a disagreement means the schedule differs from the mechanism's model, which
  a number cannot fix (see bench/prefetch_overlap.py for the mechanisms' schedules).

Bounded: at most ``max_iterations`` compiles.  Converged: the compiled plan fits and its peak is
within ``tolerance`` of the corrected prediction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tierax import compile as compile_lib
from tierax import planner, planning
from tierax.errors import TieraxError
from tierax.mesh import MeshShape


@dataclass(frozen=True)
class Iteration:
    iteration: int
    budget_bytes: (
        int  # what the planner was given (the device budget less the workspace correction)
    )
    workspace_correction_bytes: int  # added to the model's workspace term for this solve
    predicted_peak_bytes: int  # the corrected model's peak for the chosen plan
    xla_peak_bytes: int
    xla_fits: bool  # XLA's peak within the device (less the runtime reserve) and within the budget
    predicted_exposed_s: float
    xla_exposed_s: float
    predicted_step_s: float
    host_bytes: int
    xla_host_bytes: int
    compile_s: float

    @property
    def peak_error(self) -> float:
        return self.predicted_peak_bytes / self.xla_peak_bytes - 1

    def to_json(self) -> dict:
        return asdict(self) | {"peak_error": self.peak_error}


@dataclass(frozen=True)
class CheckResult:
    result: planner.PlanResult  # the last plan solved (the one compiled last)
    iterations: tuple[Iteration, ...]
    converged: bool
    tolerance: float

    def to_json(self) -> dict:
        return {
            "plan": self.result.to_json(),
            "iterations": [i.to_json() for i in self.iterations],
            "converged": self.converged,
            "tolerance": self.tolerance,
        }


def check(
    cfg,
    mesh: MeshShape,
    rates,
    target: str,
    *,
    microbatch: int,
    seq: int,
    schedule: str = "lhs",
    budget_bytes: float | None = None,
    host_budget_bytes: float | None = None,
    segments: bool = False,
    max_iterations: int = 4,
    tolerance: float = 0.05,
    report: Callable[[Iteration], None] | None = None,
) -> CheckResult:
    """Plan, compile, correct the workspace term and re-plan until the compiled plan fits and
    agrees."""
    request = planning.Request(
        cfg,
        mesh.to_dict(),
        rates,
        microbatch=microbatch,
        seq=seq,
        schedule=schedule,
        budget_bytes=budget_bytes,
        host_budget_bytes=host_budget_bytes,
        segments=segments,
    )
    return check_request(
        request, target, max_iterations=max_iterations, tolerance=tolerance, report=report
    )


def check_request(
    request: planning.Request,
    target: str,
    *,
    max_iterations: int = 4,
    tolerance: float = 0.05,
    report: Callable[[Iteration], None] | None = None,
) -> CheckResult:
    """:func:`check` of a :class:`tierax.planning.Request` (each solve is
    :func:`tierax.planning.solve` of it at the corrected budget)."""
    if request.max_microbatch or request.for_tool:
        raise TieraxError(
            "--check compiles one plan at a given --microbatch; drop --emit/--for/--max-microbatch"
        )
    cfg, rates, microbatch, seq = request.cfg, request.rates, request.microbatch, request.seq
    mesh = MeshShape(**request.mesh)
    budget, host_budget = planner.budgets(rates, request.budget_bytes, request.host_budget_bytes)
    inventories: dict = {}
    correction, steps = 0, []
    result = None
    for it in range(1, max_iterations + 1):
        try:
            result, _ = planning.solve(
                dataclasses.replace(
                    request, budget_bytes=budget - correction, host_budget_bytes=host_budget
                ),
                inventories,
            )
        except planner.NoPlanFits as e:
            if it == 1:
                raise
            raise planner.NoPlanFits(
                f"after compile {it - 1}, XLA needs {correction / 2**30:.2f} GiB more than the "
                f"model predicts; with that workspace, {e}"
            ) from None
        compiled, _ = compile_lib.compile_for_target(
            cfg, result.plan, target, microbatch=microbatch, seq=seq, mesh=mesh
        )
        b = result.predicted.breakdown
        fits = (
            compiled.fits and compiled.device_peak_bytes <= budget
        )  # the device, and the budget asked for
        step = Iteration(
            it,
            int(budget - correction),
            correction,
            result.predicted.peak_device_bytes + correction,
            compiled.device_peak_bytes,
            fits,
            b["exposed_d2h_s"] + b["exposed_h2d_s"],
            compiled.overlap.get("est_exposed_s", 0.0),
            result.predicted.step_time_s,
            result.predicted.host_bytes,
            compiled.host_temp_bytes,
            compiled.compile_time_s,
        )
        steps.append(step)
        if report:
            report(step)
        if fits and abs(step.peak_error) <= tolerance:
            return CheckResult(result, tuple(steps), True, tolerance)
        # XLA's peak minus the model's raw peak for this plan: the workspace the model does not see.
        # The largest miss seen so far: a budget that only shrinks, so the loop cannot cycle between
        # plans.
        miss = compiled.device_peak_bytes - result.predicted.peak_device_bytes
        correction = miss if it == 1 else max(correction, miss)
    return CheckResult(result, tuple(steps), False, tolerance)
