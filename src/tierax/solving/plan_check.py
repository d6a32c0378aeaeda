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
* **exposed time** is compared and reported: the static check replays XLA's schedule of the copies
  at the model's rates (:func:`tierax.xla.compile.host_transfers`).  On a TPU target, tierax's own
  step, the backward's **loads** are also corrected: where the replay exposes them longer than the
  model by more than the tolerance of the predicted step, XLA:TPU's scheduler gave them shorter
  windows than the model's — its memory guard shortens prefetches as the peak nears its limit
  (deviceless v5e compiles of one plan at rising microbatches: whole windows up to
  :data:`WHOLE_WINDOW_SHARE` of the scheduler's limit, shorter above) — so the next solve plans
  below that share and below the plan's own peak.  On the v5e chip the replayed loads agree with
  the chip's waits where the model missed them, while the replay over-prices the forward's stores
  that the chip hides (``bench/investigations/replayed_exposure.py``), so stores are reported, not
  corrected.
* **XLA's own recompute** is priced, not corrected: where the program's live values reach the
  compiler's limit, its rematerialization pass recomputes values the plan keeps
  (:mod:`tierax.xla.recompute`).  :attr:`Iteration.compiled_step_s` adds it, and the loads exposed
  beyond the model, to the predicted step: the step of the program XLA compiled.  Re-planning
  below it does not remove it where the limit is reached outside the layers (the LM head at a
  large microbatch): on the v5e chip the dense microbatch-32 plan with its moments on the host ran
  at the compiled step within a few percent, while the plan this check moved it to, four compiles
  lower, recomputed nearly as much and ran slower (bench/results/chip/recompute_on_chip.json).

The correction is taken whole where the compiled plan does not fit (the budget must shrink by at
least what XLA needs more), after the first compile, and where the re-solve chose the plan compiled
before (the miss is that plan's own); where a new plan fits, it moves half the way from the
correction used to the new miss (damped: each plan has its own workspace, and taking each new
plan's miss whole swings between plans).  The planner's corrected budget never exceeds the
device's usable memory, whatever the sign of the correction.  On a TPU target the correction also
moves XLA:TPU's scheduler limit, which the planner prefers to plan within: the scheduler's share of
the device less the measured miss (:func:`corrected_rates`), in place of the margin the limit keeps
for an unmeasured one.  Because one correction serves every plan, a damped one can bring the
planner back to a plan it moved away from, past the scheduler's share by that plan's own miss; so
on a TPU target, tierax's own step, the check keeps of the plans it compiled that fitted the one of
the shortest compiled step (:func:`_shorter_earlier`; as on the chip's MoE case,
bench/results/chip/tpu_check_checked_moe_limit.json, where XLA recomputes on its own in the plan
past the share).

Bounded: at most ``max_iterations`` compiles.  Converged: the compiled plan fits and its peak is
within ``tolerance`` of the corrected prediction.  :attr:`CheckResult.stopped` says why it stopped;
:attr:`CheckResult.fitted` is the last plan whose compile fitted (None: none did).  Where the
corrected model fits no plan, the check stops unconverged if a compiled plan fitted, and raises
:class:`tierax.solving.planner.NoPlanFits` (naming XLA's miss) if none did.

The loop is one for every program it checks: what differs is how a plan is compiled
(:data:`CompilePlan`): tierax's own step for the request's model (the default,
:func:`tierax_compile`), or another program's compile of the plan — ``plan --maxtext --check``
compiles MaxText's own step with the plan's MaxText keys (:mod:`tierax.solving.maxtext_check`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tierax.costmodel.rates import SCHEDULER_MEMORY_FRACTION
from tierax.errors import TieraxError
from tierax.mesh import MeshShape
from tierax.solving import planner, planning
from tierax.xla import compile as compile_lib
from tierax.xla import recompute
from tierax.xla.result import CompileResult

# How the loop compiles a solved plan for its target: XLA's compile of the program that runs it.
CompilePlan = Callable[[planner.PlanResult], CompileResult]
# The share of XLA:TPU's scheduler limit (rates.SCHEDULER_MEMORY_FRACTION of the device's) below
# which its latency-hiding scheduler gives a prefetch the whole layer backward: deviceless v5e
# compiles of one offload plan at microbatches 5-8 gave its loads 18 kernels at 86 % and 89 % of
# the limit, 11 at 93 % and 5-6 at 95.5 % (bench/results/chip_schedule_pressure_libtpu_0.0.52.json).
WHOLE_WINDOW_SHARE = 0.89
# Where XLA recomputes on its own beyond the tolerance of the converged plan's step, these presets'
# activation placements, with that plan's training-state placements, are compiled beside it and
# the plan of the shortest compiled step kept (XLA's recompute differs between plans of one peak:
# bench/results/chip/recompute_on_chip_mb32_alternatives.json).
ALTERNATIVE_PRESETS = ("remat-full", "qkv-offload")


@dataclass(frozen=True)
class Iteration:
    iteration: int
    budget_bytes: (
        int  # what the planner was given (the device budget less the workspace correction)
    )
    workspace_correction_bytes: int  # added to the model's workspace term for this solve
    predicted_peak_bytes: int  # the corrected model's peak for the chosen plan
    xla_peak_bytes: int | None  # an out-of-memory refusal: XLA's stated need (None: none stated)
    xla_fits: bool  # XLA's peak within the device (less the runtime reserve) and within the budget
    predicted_exposed_s: float
    xla_exposed_s: float
    predicted_step_s: float
    host_bytes: int
    xla_host_bytes: int | None  # None: XLA refused the program (no memory analysis)
    compile_s: float
    out_of_memory: bool = False  # XLA refused the program for device memory
    # the backward's host loads alone: the model's exposed time and the replay's of XLA's schedule
    predicted_load_exposed_s: float = 0.0
    xla_load_exposed_s: float = 0.0
    # compute XLA's rematerialization pass added to the program (tierax.xla.recompute), per step
    xla_recompute_s: float = 0.0
    # XLA:TPU compiled the plan but its libtpu's memory_analysis() over-reports the peak (over the
    # limit it compiled within): the fit is XLA's compile, the peak no measure of the model
    peak_over_reported: bool = False
    # "": a plan of the chain of corrections; else the alternative compiled beside the converged
    # plan (:data:`ALTERNATIVE_PRESETS`: the preset's placements with that plan's state)
    alternative: str = ""

    @property
    def peak_error(self) -> float | None:
        if not self.xla_peak_bytes:
            return None
        return self.predicted_peak_bytes / self.xla_peak_bytes - 1

    def to_json(self) -> dict:
        return asdict(self) | {
            "peak_error": self.peak_error,
            "compiled_step_s": self.compiled_step_s,
        }

    @classmethod
    def of(
        cls, it: int, solve_budget: float, correction: float, result, compiled, budget: float
    ) -> Iteration:
        """Iteration ``it``: the plan ``result`` solved at ``solve_budget`` with the workspace
        ``correction``, and its ``compiled`` figures judged against ``budget`` (the device's, or
        the one asked for): XLA's peak within the device and the budget."""
        b = result.predicted.breakdown
        peak = compiled.device_peak_bytes  # an out-of-memory refusal: XLA's stated need, or None
        # XLA:TPU compiled it within its limit, whatever an older libtpu reports: the fit is the
        # compile's where the budget is the device's own
        over = compiled.peak_over_reported
        within = peak is not None and (
            peak <= budget or (over and budget >= compiled.device_limit_bytes)
        )
        return cls(
            it,
            int(solve_budget),
            int(correction),
            int(result.predicted.peak_device_bytes + correction),
            peak,
            bool(compiled.fits and within),
            # the streamed state update's exposed copies too: the replay's stalls hold them
            b.exposed_d2h_s + b.exposed_loads_s,
            compiled.overlap.get("est_exposed_s", 0.0),
            result.predicted.step_time_s,
            result.predicted.host_bytes,
            # Offloaded training state is the step's host arguments (the rest is host temp).
            None
            if compiled.host_temp_bytes is None
            else compiled.host_temp_bytes + compiled.host_argument_bytes,
            compiled.compile_time_s,
            compiled.out_of_memory,
            b.exposed_loads_s,  # the replay's h2d stalls hold the update's loads too
            compiled.overlap.get("by_direction", {}).get("h2d", {}).get("est_exposed_s", 0.0),
            compiled.xla_recompute.get("est_s", 0.0),
            over,
        )

    @property
    def load_excess_s(self) -> float:
        """Seconds XLA's schedule exposes the host loads beyond the model's."""
        return self.xla_load_exposed_s - self.predicted_load_exposed_s

    @property
    def compiled_step_s(self) -> float:
        """The predicted step with what the compiled program adds: XLA's own recompute and the
        loads its schedule exposes beyond the model's."""
        return recompute.compiled_step_s(
            self.predicted_step_s, self.xla_recompute_s, self.load_excess_s
        )


@dataclass(frozen=True)
class CheckResult:
    result: planner.PlanResult  # the last plan solved (the one compiled last)
    iterations: tuple[Iteration, ...]
    converged: bool
    tolerance: float
    budget_bytes: int = 0  # the device budget asked for (what XLA's peak must fit)
    stopped: str = ""  # why the check stopped (converged, or what kept it from converging)
    # the last plan whose compile fitted, and its iteration (None, 0: no compile fitted)
    fitted: planner.PlanResult | None = None
    fitted_iteration: int = 0

    def to_json(self) -> dict:
        return {
            "plan": self.result.to_json(),
            "fitted_iteration": self.fitted_iteration,
            "iterations": [i.to_json() for i in self.iterations],
            "converged": self.converged,
            "tolerance": self.tolerance,
            "budget_bytes": self.budget_bytes,
            "stopped": self.stopped,
        }


def size_text(n: float | None) -> str:
    """Bytes in GiB, or MiB below 1 GiB; None (XLA stated no figure): a dash."""
    if n is None:
        return "—"
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.2f} MiB"


def iteration_line(s: Iteration) -> str:
    """One compile of the check, as ``plan --check`` reports it."""
    g = size_text
    err = "—" if s.peak_error is None else f"{s.peak_error:+.1%}"
    return (
        f"check {s.iteration}"
        + (f" (alternative: {s.alternative})" if s.alternative else "")
        + f": budget {g(s.budget_bytes)} (workspace correction "
        f"{g(s.workspace_correction_bytes)}) · predicted peak {g(s.predicted_peak_bytes)} "
        f"· XLA {'refused (out of memory), needs ' if s.out_of_memory else ''}"
        f"{g(s.xla_peak_bytes)} ({err}"
        + (
            ": memory_analysis() over XLA:TPU's limit, an older libtpu's over-report; the fit is "
            "XLA's compile"
            if s.peak_over_reported
            else ""
        )
        + f") fits={'yes' if s.xla_fits else 'NO'} · exposed transfers predicted "
        f"{s.predicted_exposed_s * 1e3:.2f} ms, XLA {s.xla_exposed_s * 1e3:.2f} ms (loads "
        f"{s.predicted_load_exposed_s * 1e3:.2f} / {s.xla_load_exposed_s * 1e3:.2f}) · XLA's "
        f"own recompute {s.xla_recompute_s * 1e3:.2f} ms · step predicted "
        f"{s.predicted_step_s * 1e3:.1f} ms, with what XLA's program adds "
        f"{s.compiled_step_s * 1e3:.1f} ms · host "
        f"{g(s.host_bytes)} vs XLA {g(s.xla_host_bytes)} · compile {s.compile_s:.0f} s"
    )


def next_correction(correction: int, miss: int, fits: bool, first: bool, same_plan: bool) -> int:
    """The workspace correction for the next solve: where the compiled plan did not fit, at least
    the whole ``miss`` (XLA's peak minus the model's raw peak); where it fit, the whole miss after
    the first compile or a plan compiled twice running (the miss is that plan's own), else half
    the way from ``correction`` to ``miss`` (damped: a new plan has its own workspace)."""
    if not fits:
        return miss if first else max(correction, miss)
    if first or same_plan:
        return miss
    return correction + (miss - correction) // 2


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
    correct_loads: bool | None = None,
) -> CheckResult:
    """Plan, compile, correct the workspace term (and on a TPU target the loads' budget) and
    re-plan until the compiled plan fits and agrees."""
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
        request,
        target,
        max_iterations=max_iterations,
        tolerance=tolerance,
        report=report,
        correct_loads=correct_loads,
    )


def tierax_compile(request: planning.Request, target: str) -> CompilePlan:
    """A plan compiled as tierax's own step of the request's model for ``target``."""
    mesh = MeshShape(**request.mesh)

    def compile_plan(result: planner.PlanResult) -> CompileResult:
        return compile_lib.compile_for_target(
            request.cfg,
            result.plan,
            target,
            microbatch=request.microbatch,
            seq=request.seq,
            mesh=mesh,
            grad_accum=request.grad_accum,
        )[0]

    return compile_plan


def corrected_rates(rates, correction: float):
    """``rates`` with XLA:TPU's scheduler limit on the model's peak once a compile has measured the
    model's miss: the scheduler's own share of the device (:data:`SCHEDULER_MEMORY_FRACTION`) less
    the workspace ``correction`` (XLA's peak less the model's) in place of the margin the limit
    otherwise keeps for an unmeasured miss.  The planner then prefers plans whose corrected peak is
    within the scheduler's limit, and the model serializes the loads of a step whose corrected peak
    is above it.  Unchanged where the target has no such limit or nothing was corrected."""
    if not rates.scheduler_limit_bytes or not correction:
        return rates
    share = SCHEDULER_MEMORY_FRACTION * rates.usable_device_bytes
    return dataclasses.replace(rates, scheduler_limit_bytes=max(1, int(share - correction)))


def with_state_of(preset: str, cfg, plan):
    """Preset ``preset``'s placements with ``plan``'s training state and mechanism, named
    ``<preset>+state``: an alternative the check compiles beside a plan that offloads state."""
    from tierax import plan as plan_lib

    return dataclasses.replace(
        plan_lib.preset(preset, cfg),
        name=f"{preset}+state",
        description=f"{preset}'s placements with the checked plan's training state",
        state=plan.state,
        mechanism=plan.mechanism,
    )


def _fastest_compiled(
    request,
    result,
    step,
    steps,
    compile_plan,
    inventories,
    solve_budget,
    correction,
    budget,
    report,
) -> tuple[planner.PlanResult, str, Iteration]:
    """The converged ``result`` or an alternative (:data:`ALTERNATIVE_PRESETS`' placements with its
    state placements, where the corrected model fits them within ``solve_budget``), whichever
    XLA's compile makes the shortest step (:attr:`Iteration.compiled_step_s`); each alternative's
    compile is appended to ``steps``.  Returns (plan, what was chosen: a sentence, its
    compile)."""
    from tierax import costmodel as cm

    prog = planning.program(request, inventories)
    best, best_step = result, step
    for name in ALTERNATIVE_PRESETS:
        plan = with_state_of(name, request.cfg, result.plan)
        if (plan.groups, plan.state) == (result.plan.groups, result.plan.state):
            continue
        pred = cm.simulate(plan, prog, request.rates, request.schedule, request.grad_accum)
        if pred.peak_device_bytes + correction > solve_budget:
            continue  # the corrected model says it does not fit
        alt = dataclasses.replace(result, plan=plan, predicted=pred, explain=())
        it = len(steps) + 1
        s = dataclasses.replace(
            Iteration.of(it, solve_budget, correction, alt, compile_plan(alt), budget),
            alternative=name,
        )
        steps.append(s)
        if report:
            report(s)
        if s.xla_fits and s.compiled_step_s < best_step.compiled_step_s:
            best, best_step = alt, s
    if best is result:
        return (
            result,
            f"the plan's compiled step ({step.compiled_step_s * 1e3:.1f} ms with XLA's own "
            "recompute) is the shortest of it and the alternatives compiled; ",
            step,
        )
    return (
        best,
        f"chose {best.plan.name}: XLA recomputes {step.xla_recompute_s * 1e3:.1f} ms on its own "
        f"in the planner's plan, whose compiled step is {step.compiled_step_s * 1e3:.1f} ms; "
        f"{best.plan.name}'s is {best_step.compiled_step_s * 1e3:.1f} ms; ",
        best_step,
    )


def _shorter_earlier(chain, result, step) -> tuple[planner.PlanResult, Iteration] | None:
    """Of the plans compiled before the converged one (``chain``: (plan, its compile) of each
    earlier compile that fitted), the one whose compiled step is shorter than ``step``'s, the
    shortest; None where none is.  A plan the check moved away from (its model peak disagreed with
    XLA's) can still be the faster program: the corrected model can come back to a plan past
    XLA:TPU's scheduler share, whose compile holds XLA's own recompute."""
    placed = (result.plan.groups, result.plan.state)
    earlier = [
        (r, s)
        for r, s in chain
        if (r.plan.groups, r.plan.state) != placed and s.compiled_step_s < step.compiled_step_s
    ]
    return min(earlier, key=lambda rs: rs[1].compiled_step_s, default=None)


def check_request(
    request: planning.Request,
    target: str,
    *,
    compile_plan: CompilePlan | None = None,
    max_iterations: int = 4,
    tolerance: float = 0.05,
    report: Callable[[Iteration], None] | None = None,
    correct_loads: bool | None = None,
) -> CheckResult:
    """:func:`check` of a :class:`tierax.solving.planning.Request` (each solve is
    :func:`tierax.solving.planning.solve` of it at the corrected budget), each plan compiled by
    ``compile_plan`` (default: tierax's own step for ``target``, :func:`tierax_compile`).
    ``correct_loads``: re-plan below a plan whose loads XLA's memory guard left exposed beyond
    the model (module docstring); None: on a TPU target whose scheduler limit the model knows, for
    tierax's own step."""
    if request.max_microbatch or (compile_plan is None and request.for_tool):
        raise TieraxError(
            "--check compiles one plan at a given --microbatch; drop --emit/--for/--max-microbatch"
        )
    rates = request.rates
    if correct_loads is None:
        correct_loads = compile_plan is None and planner.scheduler_limit(rates) > 0
    if compile_plan is None:
        compile_plan = tierax_compile(request, target)
    budget, host_budget = planner.budgets(rates, request.budget_bytes, request.host_budget_bytes)
    limit = rates.usable_device_bytes  # a correction never plans beyond the device
    load_cap = limit  # below a plan whose loads XLA's schedule exposed (module docstring)
    whole_windows = WHOLE_WINDOW_SHARE * SCHEDULER_MEMORY_FRACTION * limit
    inventories: dict = {}
    correction, steps = 0, []
    result = fitted = None
    fitted_it = 0
    tol = f"{tolerance:.0%}"
    stopped = f"{max_iterations} compile(s) reached before the model agreed within {tol}"
    chain: list = []  # (plan, its compile) of each compile of the chain that fitted
    previous = None  # the placements compiled last
    for it in range(1, max_iterations + 1):
        solve_budget = min(budget - correction, limit, load_cap)
        corrected = dataclasses.replace(request, rates=corrected_rates(rates, correction))
        try:
            result, _ = planning.solve(
                dataclasses.replace(
                    corrected, budget_bytes=solve_budget, host_budget_bytes=host_budget
                ),
                inventories,
            )
        except planner.NoPlanFits as e:
            if it == 1:
                raise
            why = (
                f"after compile {it - 1}, XLA needs {size_text(correction)} more than the model "
                f"predicts; with that workspace, {e}"
                if load_cap >= limit
                else f"after compile {it - 1}, below {size_text(load_cap)} (where XLA:TPU gives "
                f"the loads their windows), {e}"
            )
            if fitted is None:
                raise planner.NoPlanFits(why) from None
            stopped = f"{why} (check {fitted_it}'s plan fitted in XLA's compile)"
            break
        compiled = compile_plan(result)
        step = Iteration.of(it, solve_budget, correction, result, compiled, budget)
        fits, peak = step.xla_fits, step.xla_peak_bytes
        steps.append(step)
        if report:
            report(step)
        if fits:
            fitted, fitted_it = result, it
            chain.append((result, step))
        loads_agree = not correct_loads or step.load_excess_s <= tolerance * step.predicted_step_s
        # an over-reported peak is no figure of the program's: the model stands on memory
        if fits and (step.peak_over_reported or abs(step.peak_error) <= tolerance) and loads_agree:
            chose, chosen = "", step
            if correct_loads and step.xla_recompute_s > tolerance * step.predicted_step_s:
                result, chose, chosen = _fastest_compiled(
                    corrected, result, step, steps, compile_plan, inventories, solve_budget,
                    correction, budget, report,
                )  # fmt: skip
                fitted = result
            if correct_loads and (earlier := _shorter_earlier(chain, result, chosen)):
                chose = (
                    f"chose check {earlier[1].iteration}'s plan: its compiled step "
                    f"({earlier[1].compiled_step_s * 1e3:.1f} ms) is shorter than the converged "
                    f"plan's ({chosen.compiled_step_s * 1e3:.1f} ms); "
                )
                result, fitted, fitted_it = earlier[0], earlier[0], earlier[1].iteration
            return CheckResult(
                result,
                tuple(steps),
                True,
                tolerance,
                int(budget),
                chose
                + (
                    "converged: XLA:TPU compiled the plan within its limit (its libtpu's "
                    "memory_analysis() over-reports the peak, so the model's is not compared)"
                    if step.peak_over_reported
                    else "converged: XLA's peak fits the budget and the corrected model is "
                    f"within {tol}"
                )
                + ("; XLA's schedule hides the loads as the model does" if correct_loads else ""),
                fitted,
                fitted_it,
            )
        if peak is None:  # refused with no stated need: nothing to correct the model by
            stopped = "XLA refused the program without stating its need: nothing to correct by"
            break
        if not loads_agree:
            # plan below the scheduler's whole-window share and below this plan's own peak
            raw = result.predicted.peak_device_bytes
            load_cap = min(load_cap, whole_windows, raw - 0.01 * limit)
            stopped = (
                f"{max_iterations} compile(s) reached before XLA's schedule hid the loads as the "
                "model does"
            )
        # XLA's peak minus the model's raw peak for this plan: the workspace the model does not see
        # (none to read from an over-reported peak)
        miss = correction if step.peak_over_reported else peak - result.predicted.peak_device_bytes
        placed = (result.plan.groups, result.plan.state)
        correction = next_correction(correction, miss, fits, it == 1, placed == previous)
        previous = placed
    return CheckResult(
        result, tuple(steps), False, tolerance, int(budget), stopped, fitted, fitted_it
    )


@dataclass(frozen=True)
class MicrobatchStep:
    iteration: int
    microbatch: int
    # "model" (the corrected model's largest microbatch) or "bracket" (one past the largest fit)
    proposed_by: str
    correction_bytes: int  # XLA's peak minus the model's, from the compile before (0: none yet)
    predicted_peak_bytes: int  # the model's peak for the plan compiled, uncorrected
    xla_peak_bytes: int | None
    xla_fits: bool
    out_of_memory: bool
    compile_s: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MicrobatchCheck:
    # the largest microbatch whose plan XLA compiled within the budget
    result: planner.PlanResult | None
    steps: tuple[MicrobatchStep, ...]
    # one microbatch more was refused by XLA, or the corrected model fits no plan there
    converged: bool

    def to_json(self) -> dict:
        return {
            "plan": self.result.to_json() if self.result else None,
            "steps": [s.to_json() for s in self.steps],
            "compiles": len(self.steps),
            "converged": self.converged,
        }


def max_microbatch_check(
    cfg,
    mesh: MeshShape,
    rates,
    target: str,
    *,
    seq: int,
    schedule: str = "lhs",
    budget_bytes: float | None = None,
    host_budget_bytes: float | None = None,
    max_compiles: int = 5,
    report: Callable[[MicrobatchStep], None] | None = None,
) -> MicrobatchCheck:
    """The largest microbatch whose planned step fits in XLA's compile for ``target``.

    The model proposes (``planner.max_microbatch``); XLA's compile of that plan confirms it or not;
    the model is corrected by XLA's peak minus its own (the workspace correction of :func:`check`,
    whose sign may say the model is high) and proposes again, within the bracket the compiles have
    set (above the largest microbatch that fitted, below the smallest that did not; one past the
    largest fit when the model proposes nothing new).  Stops when one more than the largest fit was
    refused (or has no plan under the corrected model), or after ``max_compiles``.
    """
    budget, host_budget = planner.budgets(rates, budget_bytes, host_budget_bytes)
    best, best_mb, fail_mb, correction, steps = None, 0, None, 0, []
    mesh_d = mesh.to_dict()
    converged = False

    def solve(**request):  # through the one solve path, at the corrected budget
        # A correction measured at a larger microbatch can exceed the whole budget (a workspace
        # that grows with the batch): the bracket's next microbatch is then solved at the budget
        # itself, and XLA's compile judges it.
        corrected = budget - correction
        return planning.solve(
            planning.Request(
                cfg=cfg,
                mesh=mesh_d,
                rates=rates,
                seq=seq,
                schedule=schedule,
                budget_bytes=corrected if corrected > 0 else budget,
                host_budget_bytes=host_budget,
                **request,
            )
        )[0]

    for it in range(1, max_compiles + 1):
        proposed, how = None, "model"
        try:
            if budget - correction > 0:  # else no microbatch fits the corrected model
                proposed = solve(max_microbatch=True)
            if proposed is not None and not proposed.predicted.fits and proposed.microbatch == 1:
                proposed = None
        except planner.NoPlanFits:
            proposed = None
        mb = proposed.microbatch if proposed is not None else 0
        if mb <= best_mb or (fail_mb is not None and mb >= fail_mb):
            mb, how = (best_mb + 1 if mb <= best_mb else fail_mb - 1), "bracket"
        if mb < 1 or (fail_mb is not None and mb >= fail_mb) or mb <= best_mb:
            converged = best is not None
            break
        if proposed is None or proposed.microbatch != mb:
            try:
                proposed = solve(microbatch=mb, name=f"planned-mb{mb}")
            except planner.NoPlanFits:
                if best is not None and mb == best_mb + 1:  # the corrected model fits no more
                    converged = True
                    break
                raise
        compiled, _ = compile_lib.compile_for_target(
            cfg, proposed.plan, target, microbatch=mb, seq=seq, mesh=mesh
        )
        peak = compiled.device_peak_bytes
        fits = compiled.fits and peak is not None and peak <= budget
        step = MicrobatchStep(
            it,
            mb,
            how,
            correction,
            proposed.predicted.peak_device_bytes,
            compiled.device_peak_bytes,
            fits,
            compiled.out_of_memory,
            compiled.compile_time_s,
        )
        steps.append(step)
        if report:
            report(step)
        if fits:
            best, best_mb = proposed, mb
        else:
            fail_mb = mb if fail_mb is None else min(fail_mb, mb)
        if compiled.device_peak_bytes is not None:
            correction = compiled.device_peak_bytes - proposed.predicted.peak_device_bytes
        if best is not None and fail_mb == best_mb + 1:
            converged = True
            break
    return MicrobatchCheck(best, tuple(steps), converged)
