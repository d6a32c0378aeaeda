"""Calibration of the cost model from measured runs: a runs file (:mod:`.runs`), the least-squares
fit of per-target resource factors with leave-one-out errors (:mod:`.fit`); the result is a
:class:`tierax.costmodel.calibrated.CalibratedRates` (RATES.yaml, read by ``--rates``)."""

from tierax.calibration.fit import (
    BOUNDS,
    GROUPINGS,
    GroupFit,
    calibrate,
    calibrated_rates,
    fit_factors,
    fit_group,
    problems,
)
from tierax.calibration.runs import PreparedRun, Run, load_runs, maxtext_step_seconds, prepare

__all__ = [
    "BOUNDS",
    "GROUPINGS",
    "GroupFit",
    "PreparedRun",
    "Run",
    "calibrate",
    "calibrated_rates",
    "fit_factors",
    "fit_group",
    "load_runs",
    "maxtext_step_seconds",
    "prepare",
    "problems",
]
