"""``plan --maxtext --check`` and ``plan --maxtext --max-microbatch``: planning checked against
MaxText's own program.

``--check`` closes :mod:`tierax.solving.plan_check`'s loop on MaxText's own program: a plan is
compiled as the MaxText keys ``--emit maxtext`` writes for it
(:func:`tierax.solving.for_maxtext.maxtext_overrides`), over the user's, by MaxText's own train
step (:class:`MaxTextCompile`).  ``--max-microbatch`` searches the largest batch the model fits a
plan of, MaxText's program retraced at each batch (:class:`BatchSearch`), each batch's plan
compiled by :func:`check_batch`; :func:`what_would_fit` says what would fit where nothing does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tierax.sizes import size_text
from tierax.solving.for_maxtext import maxtext_overrides

if TYPE_CHECKING:  # the planner imports JAX
    from tierax.solving import planner
    from tierax.xla.result import CompileResult


class MaxTextCompile:
    """How ``plan --maxtext --check`` compiles a plan (a
    :data:`tierax.solving.plan_check.CompilePlan`): MaxText's own train step for ``path`` with
    :func:`maxtext_overrides`, compiled for ``devices`` devices of ``target``
    (:func:`tierax.xla.maxtext_step.compile_program`, what ``tierax compile --maxtext`` runs).  JAX
    must have started for it (:func:`tierax.launch.start_maxtext_compile`, with the run's
    environment).  What MaxText prints goes to stderr.

    The same keys compile to the same program: a plan whose keys were compiled before gets that
    compile again (its ``compile_time_s`` 0, a note saying so), not a second compile of minutes;
    :attr:`compiles` counts the compiles run, :attr:`largest_miss` is the most a compile's peak (or
    out-of-memory need) exceeded the model's raw peak of its plan (0 before any compile)."""

    def __init__(self, run, *, path: str, user: Sequence[str], target: str, devices: int):
        self.run, self.path, self.user = run, path, list(user)
        self.target, self.devices = target, devices
        self.compiles = 0
        self.largest_miss = 0
        self.misses: list[int] = []  # each compile's peak (or need) less the model's raw peak
        self._done: dict[tuple[str, ...], CompileResult] = {}

    def __call__(self, result: planner.PlanResult) -> CompileResult:
        import contextlib
        import dataclasses
        import sys

        from tierax.xla.maxtext_step import compile_program

        keys = tuple(maxtext_overrides(result, self.run, self.user))
        if keys in self._done:
            done = self._done[keys]
            note = "the same MaxText keys were compiled before: that compile, not another"
            return dataclasses.replace(done, compile_time_s=0.0, notes=(*done.notes, note))
        with contextlib.redirect_stdout(sys.stderr):
            compiled, _ = compile_program(
                self.path, list(keys), target=self.target, devices=self.devices
            )
        self.compiles += 1
        self._done[keys] = compiled
        if compiled.device_peak_bytes is not None:
            miss = int(compiled.device_peak_bytes - result.predicted.peak_device_bytes)
            self.misses.append(miss)
            self.largest_miss = max(self.largest_miss, miss)
        return compiled


# The largest vocabulary tiling what_would_fit tries (doubling from the config's).
MAX_VOCAB_TILES = 64


def what_would_fit(request, trace, *, tiles: int, microbatch: int, seq: int, miss: int) -> str:
    """Where no plan of MaxText's program fits: the first of the config's vocabulary tiling doubled
    (up to :data:`MAX_VOCAB_TILES`, dividing ``seq``), then its per-device batch halved, whose
    program (``trace(keys, microbatch)``: MaxText's program traced with those keys over the
    user's, or None where MaxText refuses them) the model, its budget less ``miss`` (what MaxText's
    compile needed beyond the model), fits a plan of; the words saying so, or that none did."""
    import dataclasses

    from tierax.solving import planner, planning

    budget, host_budget = planner.budgets(
        request.rates, request.budget_bytes, request.host_budget_bytes
    )
    corrected = budget - max(miss, 0)
    by = f" with MaxText's compiled miss ({size_text(miss)}) added" if miss > 0 else ""
    probes = [(f"num_vocab_tiling={n}", None) for n in _doublings(tiles, seq)]
    probes += [(None, mb) for mb in _halvings(microbatch)]
    for key, mb in probes:
        run = trace([key] if key else [], mb)
        if run is None or corrected <= 0:
            continue
        try:
            result, _ = planning.solve(
                dataclasses.replace(
                    request,
                    program=run.program,
                    microbatch=run.program.microbatch,
                    budget_bytes=corrected,
                    host_budget_bytes=host_budget,
                )
            )
        except planner.NoPlanFits:
            continue
        tensor = int(request.mesh.get("tensor", 1))
        what = key or f"per_device_batch_size={mb / tensor:g}"
        return (
            f"What would fit (the model{by}; not compiled): {what}, a plan predicted at "
            f"{size_text(result.predicted.peak_device_bytes + max(miss, 0))}; run plan "
            "--check with it to compile that plan."
        )
    return (
        f"Neither num_vocab_tiling up to {MAX_VOCAB_TILES} nor a smaller per_device_batch_size "
        f"fits by the model{by}; plan it over more devices (a larger fsdp)."
    )


def _doublings(tiles: int, seq: int) -> list[int]:
    out, n = [], max(tiles, 1) * 2
    while n <= MAX_VOCAB_TILES:
        if seq % n == 0:
            out.append(n)
        n *= 2
    return out


def _halvings(microbatch: int) -> list[int]:
    out, mb = [], microbatch // 2
    while mb >= 1:
        out.append(mb)
        mb //= 2
    return out


class BatchSearch:
    """``plan --maxtext --max-microbatch``: the largest microbatch (sequences per device of the
    batch axes; MaxText's ``per_device_batch_size`` × tensor) whose MaxText program the model fits
    a plan of, one placement per name under XLA's offload policy (what MaxText runs), the training
    state on device.  ``trace(microbatch)``: MaxText's program at that microbatch (None where
    MaxText refuses it), each microbatch traced once however many searches ask for it
    (:attr:`traces` counts them); the search is :func:`tierax.solving.planner.largest_fitting`'s
    doubling and bisection."""

    def __init__(self, request, trace, limit: int | None = None):
        from tierax.solving import planner

        self.request, self._trace = request, trace
        self.limit = planner.MAX_MICROBATCH_SEARCH if limit is None else limit
        self._runs: dict[int, object] = {}
        self.traces = 0

    def run(self, microbatch: int):
        """MaxText's program at ``microbatch`` (traced once), or None where MaxText refuses it."""
        if microbatch not in self._runs:
            self._runs[microbatch] = self._trace(microbatch)
            self.traces += 1
        return self._runs[microbatch]

    def fits(self, microbatch: int, miss: int = 0) -> bool:
        """Whether the model fits a plan of the program at ``microbatch`` in the budget less
        ``miss`` (what MaxText's compile needed beyond the model; negative where it needed less)."""
        from tierax.solving import planner

        run = self.run(microbatch)
        rates = self.request.rates
        budget, host_budget = planner.budgets(
            rates, self.request.budget_bytes, self.request.host_budget_bytes
        )
        # a negative miss (MaxText's compile needed less than the model) lets the model's peak go
        # past the budget by that much: its compile is then expected within the budget
        corrected = budget - miss
        if run is None or corrected <= 0:
            return False
        try:
            planner.plan(
                run.program,
                rates,
                schedule=self.request.schedule,
                budget_bytes=corrected,
                host_budget_bytes=host_budget,
                one_placement_per_name=True,
                mechanism="policy",
                place_state=False,
                grad_accum=self.request.grad_accum,
            )
        except planner.NoPlanFits:
            return False
        return True

    def largest(self, miss: int = 0, below: int | None = None) -> int:
        """The largest microbatch below ``below`` (default: the search's limit + 1) that
        :meth:`fits` with ``miss``; 0 where none does."""
        from tierax.solving import planner

        bound = self.limit if below is None else min(self.limit, below - 1)
        return planner.largest_fitting(lambda mb: self.fits(mb, miss), bound)


def check_batch(request, compile_plan, *, correction: int, attempts: int, report=None):
    """One batch of ``plan --maxtext --max-microbatch --check``: the plan the model solves with
    ``correction`` (what MaxText's compile needed beyond the model's peak at a batch compiled
    before; negative where it needed less: the model's peak may then pass the budget by that much)
    compiled by ``compile_plan``; where it does not fit, the correction becomes this compile's miss
    and the plan is solved and compiled again, up to ``attempts`` compiles.  A
    :class:`tierax.solving.plan_check.CheckResult` (converged: the last compile fitted the budget
    and the corrected model was within the check's tolerance of it).

    Raises:
      planner.NoPlanFits: the corrected model fits no plan at this batch.
    """
    import dataclasses

    from tierax.solving import plan_check, planner, planning

    budget, host_budget = planner.budgets(
        request.rates, request.budget_bytes, request.host_budget_bytes
    )
    tolerance, steps, fitted, fitted_it, result = 0.05, [], None, 0, None
    stopped = f"{attempts} compile(s) at this batch, none fitted the budget"
    for it in range(1, attempts + 1):
        solve_budget = budget - correction
        if solve_budget <= 0:
            raise planner.NoPlanFits(
                f"MaxText's compile needs {size_text(correction)} beyond the model, "
                f"more than the budget {size_text(budget)}"
            )
        result, _ = planning.solve(
            dataclasses.replace(request, budget_bytes=solve_budget, host_budget_bytes=host_budget)
        )
        compiled = compile_plan(result)
        step = plan_check.Iteration.of(it, solve_budget, correction, result, compiled, budget)
        fits, peak = step.xla_fits, step.xla_peak_bytes
        steps.append(step)
        if report:
            report(step)
        if fits:
            fitted, fitted_it = result, it
            agreed = step.peak_error is not None and abs(step.peak_error) <= tolerance
            stopped = (
                f"converged: MaxText's peak fits the budget and the corrected model is within "
                f"{tolerance:.0%}"
                if agreed
                else f"MaxText's peak fits the budget; the corrected model is off by "
                f"{step.peak_error:+.1%}"
            )
            return plan_check.CheckResult(
                result, tuple(steps), agreed, tolerance, int(budget), stopped, fitted, fitted_it
            )
        if peak is None:
            stopped = "MaxText's compile refused the program without stating its need"
            break
        correction = int(peak - result.predicted.peak_device_bytes)
    return plan_check.CheckResult(
        result, tuple(steps), False, tolerance, int(budget), stopped, fitted, fitted_it
    )
