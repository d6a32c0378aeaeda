"""Fitting the cost model's resource factors to measured runs (:func:`calibrate`): per target kind
(or per platform), least squares on the runs' relative step-time errors, each run's leave-one-out
error beside the uncalibrated model's, and the refusals.

The fit re-evaluates the cost model at every trial factor (``scipy.optimize.least_squares``,
trust-region reflective, finite-difference Jacobian), because the step time is not linear in the
factors: the exposed collectives and host copies are what compute leaves unhidden, and compute
moves with the GEMM, attention and memory factors.  Factors are bounded to :data:`BOUNDS`; one that
stops at a bound is reported (``clamped``).

Refused (:class:`tierax.errors.TieraxError`), before anything is written:

- a group with fewer runs than factors + 1: fewer than the factors cannot determine them, and with
  exactly as many no run can be left out and the rest still determine them, so the fit could not
  be checked;
- a factor no run of its group spends time on (it cannot be fitted: choose ``--factors``);

Without ``--factors`` each group's factors are chosen by :func:`auto_group`.
- a group whose median leave-one-out error is worse than the uncalibrated model's median error.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tierax.costmodel.calibrated import CalibratedRates, FactorSet, RunError
from tierax.costmodel.resources import RESOURCES, check_resources
from tierax.errors import TieraxError

BOUNDS = (0.25, 4.0)
GROUPINGS = ("target", "platform")
METHOD = (
    "per {by}: scipy.optimize.least_squares (trust-region reflective) on relative step-time "
    "errors, the cost model re-evaluated at every trial factor (exposed collectives and host "
    "copies are not linear in the factors); factors bounded to [{lo:g}, {hi:g}]; leave-one-out: "
    "each run predicted by the factors fitted on its group's other runs"
)
AUTO = (
    "; factors chosen per group: of every subset of the resources its runs use that they can "
    "fit with no factor at a bound, the one with the smallest median leave-one-out error (a "
    "choice made on these runs, so their leave-one-out errors are optimistic; runs not fitted "
    "check it)"
)


@dataclass(frozen=True)
class GroupFit:
    """One group's fit: its runs (prepared), factors, clamped factors and per-run errors."""

    key: str
    runs: tuple  # PreparedRun, in the runs file's order
    factor_names: tuple[str, ...]
    factors: dict
    clamped: tuple[str, ...]
    errors: dict  # run name -> RunError
    # with automatic factors: each subset tried -> its median leave-one-out error
    tried: tuple = ()

    def factor_set(self) -> FactorSet:
        return FactorSet(dict(self.factors), dict(self.errors), self.clamped)


def group_key(target: str, by: str) -> str:
    """The group a run on ``target`` is fitted in: its target kind, or its platform."""
    from tierax import hardware

    if by not in GROUPINGS:
        raise TieraxError(f"--by {by!r}: choose one of {', '.join(GROUPINGS)}")
    return target if by == "target" else hardware.platform(target)


def fit_factors(
    runs: Sequence, names: Sequence[str], bounds: tuple[float, float] = BOUNDS
) -> tuple[dict, tuple[str, ...]]:
    """The factors ``names`` that minimise the sum of squared relative errors of ``runs``
    (:class:`~tierax.calibration.runs.PreparedRun`), and those that stopped at a bound."""
    import numpy as np
    from scipy.optimize import least_squares

    names = tuple(names)

    def residuals(x):
        f = dict(zip(names, (float(v) for v in x), strict=True))
        return np.array([r.step_s(f) / r.run.measured_s - 1.0 for r in runs])

    lo, hi = bounds
    sol = least_squares(
        residuals,
        np.ones(len(names)),
        bounds=(np.full(len(names), lo), np.full(len(names), hi)),
        method="trf",
        x_scale=1.0,
        diff_step=1e-6,
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
    )
    factors = {n: float(v) for n, v in zip(names, sol.x, strict=True)}
    clamped = tuple(n for n, v in factors.items() if v <= lo * (1 + 1e-6) or v >= hi * (1 - 1e-6))
    return factors, clamped


def used_resources(runs: Sequence) -> tuple[str, ...]:
    """The resources some run of ``runs`` spends predicted time on (uncalibrated)."""
    return tuple(r for r in RESOURCES if any(p.predict().split.seconds(r) > 0 for p in runs))


def fit_group(key: str, runs: Sequence, requested: Sequence[str] | None) -> GroupFit:
    """Fit group ``key``'s factors (``requested``, or every resource its runs spend time on) and
    each run's leave-one-out prediction.

    Raises:
      TieraxError: a requested factor no run spends time on, or fewer runs than factors + 1.
    """
    used = used_resources(runs)
    if requested is None:
        names = used
    else:
        names = tuple(r for r in RESOURCES if r in requested)
        idle = [r for r in names if r not in used]
        if idle:
            raise TieraxError(
                f"{key}: no run spends predicted time on {', '.join(idle)}, so its factor cannot "
                f"be fitted; leave it out of --factors (these runs use: {', '.join(used)})"
            )
    if len(runs) < len(names) + 1:
        raise TieraxError(
            f"{key}: {len(runs)} run{'s' if len(runs) != 1 else ''} for {len(names)} factor"
            f"{'s' if len(names) != 1 else ''} ({', '.join(names)}): a fit needs at least one run "
            "more than its factors (fewer cannot determine them; as many leave no run out for the "
            "leave-one-out check); add runs or fit fewer factors with --factors "
            f"(e.g. --factors {names[0]})"
        )
    factors, clamped = fit_factors(runs, names)
    errors = {}
    for i, r in enumerate(runs):
        without, _ = fit_factors([o for j, o in enumerate(runs) if j != i], names)
        errors[r.run.name] = RunError(
            measured_s=r.run.measured_s,
            uncalibrated_s=r.step_s(),
            loo_s=r.step_s(without),
            fitted_s=r.step_s(factors),
        )
    return GroupFit(key, tuple(runs), names, factors, clamped, errors)


def auto_group(key: str, runs: Sequence) -> GroupFit:
    """Group ``key``'s fit with the factors chosen automatically: of every non-empty subset of the
    resources its runs spend time on that they can fit (at most runs − 1 factors), the one whose
    median leave-one-out error is smallest (ties: fewer factors), among the subsets whose fit
    leaves no factor at a bound of :data:`BOUNDS`.

    A factor that stops at a bound is no least-squares estimate of its resource's time: the
    minimum lies outside the range, so the factor is standing in for another term's error (a
    memory factor of 0.25 making fp8 runs faster, say).  Only where every subset clamps one is the
    smallest median leave-one-out error taken regardless (its ``clamped`` says which)."""
    import itertools

    used = used_resources(runs)
    best, best_clamped, tried = None, None, []
    for k in range(1, min(len(used), len(runs) - 1) + 1):
        for names in itertools.combinations(used, k):
            g = fit_group(key, runs, names)
            loo = g.factor_set().median_abs_error("loo")
            tried.append((names, loo))
            if g.clamped:
                if best_clamped is None or loo < best_clamped[1] - 1e-12:
                    best_clamped = (g, loo)
            elif best is None or loo < best[1] - 1e-12:
                best = (g, loo)
    best = best or best_clamped
    if best is None:
        return fit_group(key, runs, used[:1])  # refused there: too few runs for one factor
    return dataclasses.replace(best[0], tried=tuple(tried))


def problems(fits: Sequence[GroupFit]) -> list[str]:
    """Why the fit is refused (empty: it is not): each group whose median leave-one-out error is
    worse than the uncalibrated model's."""
    out = []
    for g in fits:
        fs = g.factor_set()
        loo, unc = fs.median_abs_error("loo"), fs.median_abs_error("uncalibrated")
        if loo > unc:
            out.append(
                f"{g.key}: the median leave-one-out error ({loo:.1%}) is worse than the "
                f"uncalibrated model's ({unc:.1%}); fit fewer factors (--factors), or add runs"
            )
    return out


def calibrate(
    prepared: Sequence, *, by: str = "target", factors: Sequence[str] | None = None
) -> list[GroupFit]:
    """Fit every group of ``prepared`` runs (:class:`~tierax.calibration.runs.PreparedRun`),
    grouped ``by`` target kind or platform, with the resource ``factors`` given (None: chosen per
    group by :func:`auto_group`).  Check the result with :func:`problems`.

    Raises:
      TieraxError: an unknown grouping or factor, or a group that cannot be fitted
        (:func:`fit_group`).
    """
    if factors is not None:
        check_resources(factors, "--factors")
        if not factors:
            raise TieraxError(f"--factors is empty; give some of {', '.join(RESOURCES)}")
    groups: dict[str, list] = {}
    for p in prepared:
        groups.setdefault(group_key(p.run.target, by), []).append(p)
    if factors is None:
        return [auto_group(k, runs) for k, runs in groups.items()]
    return [fit_group(k, runs, factors) for k, runs in groups.items()]


def calibrated_rates(
    fits: Sequence[GroupFit],
    *,
    by: str,
    auto: bool,
    tierax: dict,
    created: str,
    command: str,
    schedule: str,
) -> CalibratedRates:
    """The :class:`CalibratedRates` of checked fits (``auto``: their factors were chosen by
    :func:`auto_group`)."""
    return CalibratedRates(
        groups={g.key: g.factor_set() for g in fits},
        schedule=schedule,
        method=METHOD.format(by=by, lo=BOUNDS[0], hi=BOUNDS[1]) + (AUTO if auto else ""),
        tierax=tierax,
        created=created,
        command=command,
    )


def median_abs(values) -> float:
    return statistics.median(abs(v) for v in values)
