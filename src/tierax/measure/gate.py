"""Gradient checks that gate other work: ``train --verify`` and ``bench --verify``."""

from __future__ import annotations

from tierax.errors import TieraxError
from tierax.measure import verify as verify_lib


def verify_before_training(cfg) -> str:
    """``train --verify``: the plan's loss and gradients against ``save-all`` on one local
    device (``tierax.measure.verify``); returns the line to print.

    Raises:
      TieraxError: the plan changes the gradients beyond the dtype's tolerance.
    """
    res = verify_lib.verify_plan(
        cfg.model, cfg.plan, microbatch=cfg.microbatch, seq=cfg.seq, seed=cfg.seed
    )
    if not res.passed:
        raise TieraxError(
            f"--verify: plan {cfg.plan.name!r} changes the gradients of {cfg.model.name} (max "
            f"relative error {res.max_rel_err:.2e}, tolerance {res.tolerance:.0e}; worst leaves: "
            f"{res.worst_leaves}); not training"
        )
    return (
        f"verify: plan {cfg.plan.name} vs save-all: max relative gradient error "
        f"{res.max_rel_err:.2e} ≤ {res.tolerance:.0e}, passed"
    )
