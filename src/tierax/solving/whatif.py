"""What-if questions for the cost model: rate overrides (``--rate``) and sweeps (``--sweep``).

``--rate host_link=900`` asks "with a 900 GB/s-per-direction host link"; ``--sweep
host_link=100:1000:100`` solves the plan at every point and says what changed in it.
Nothing here compiles: these are predictions of :mod:`tierax.costmodel`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tierax import costmodel as cm
from tierax import plan as plan_lib
from tierax.costmodel.rates import INTEGER_KEYS, RATE_KEYS, _number, override_rates
from tierax.errors import TieraxError

GIB = 2**30

SWEEP_KEYS = ("budget", "microbatch", *RATE_KEYS)


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``KEY=LO:HI:STEP`` → (key, points LO, LO+STEP, … ≤ HI).

    Raises:
      TieraxError: unknown key, bad numbers, or no points.
    """
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or key not in SWEEP_KEYS:
        raise TieraxError(
            f"--sweep {text!r}: expected KEY=LO:HI:STEP with KEY one of {', '.join(SWEEP_KEYS)} "
            "(budget in GiB, microbatch in sequences per device, rates as --rate)"
        )
    parts = spec.split(":")
    if len(parts) != 3:
        raise TieraxError(f"--sweep {text!r}: expected LO:HI:STEP, e.g. {key}=100:1000:100")
    lo, hi, step = (_number(p, f"--sweep {text!r}") for p in parts)
    if hi < lo:
        raise TieraxError(
            f"--sweep {text!r}: no points (HI {hi:g} is below LO {lo:g}); give LO ≤ HI"
        )
    n = int(math.floor((hi - lo) / step + 1e-9)) + 1
    points = [lo + i * step for i in range(n)]
    if key == "microbatch" or key in INTEGER_KEYS:
        if any(p != int(p) for p in points):
            raise TieraxError(
                f"--sweep {text!r}: {key} counts "
                f"{'sequences' if key == 'microbatch' else 'devices'}; give whole "
                f"numbers, e.g. {key}=1:16:1"
            )
        points = [float(int(p)) for p in points]
    if len(points) > 200:
        raise TieraxError(
            f"--sweep {text!r}: {len(points)} points; use a larger STEP (at most 200 points)"
        )
    return key, points


@dataclass(frozen=True)
class SweepPoint:
    value: float
    fits: bool
    tflops_per_device: float | None  # the planner's plan
    step_time_s: float | None
    peak_device_bytes: int | None
    host_bytes: int | None
    placements: dict  # "group/name" → placement value
    changed: tuple[str, ...]  # vs the previous point that fit: "moe_mlpwi_0 → offload"
    reference: dict  # preset name → predicted TFLOP/s/device (None: does not fit)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _flat(plan, cfg) -> dict:
    """Every placement of ``plan``: each name's, each group's unnamed intermediates (``unnamed``)
    and its training state's parts (``state:KIND``), so that a change in any of them is named."""
    out = {
        f"{g}/{n}": p.value
        for g, names in plan_lib.resolve(plan, cfg).items()
        for n, p in names.items()
    }
    for g, gp in plan.groups.items():
        out[f"{g}/unnamed"] = gp.unnamed.value
        for kind in plan_lib.STATE_KINDS:
            out[f"{g}/state:{kind}"] = plan.state_of(g).placement(kind).value
    return out


def _changes(before: dict | None, after: dict, weight: dict) -> tuple[str, ...]:
    """What changed, largest activations (bytes over all layers) first."""
    if before is None:
        return ()
    groups = {k.split("/")[0] for k in after}
    out = []
    for k in sorted(after, key=lambda k: (-weight.get(k, 0), k)):
        if before.get(k) != after[k]:
            g, n = k.split("/")
            out.append(f"{n if len(groups) == 1 else k} → {after[k]}")
    return tuple(out)


def sweep(
    key: str,
    points: Sequence[float],
    *,
    solve: Callable[[str, float], tuple],
    references: Sequence[str] = (),
    progress: Callable[[str, int], None] | None = None,
) -> list[SweepPoint]:
    """Solve at every point.

    ``solve(key, value)`` → (PlanResult or None if nothing fits, cfg, {preset: Prediction}) for that
    point.
    """
    out, last = [], None
    for v in points:
        result, cfg, refs = solve(key, v)
        ref = {
            name: (p.tflops_per_device if p.fits else None)
            for name, p in refs.items()
            if name in references
        }
        if result is None:
            out.append(SweepPoint(v, False, None, None, None, None, {}, (), ref))
        else:
            flat = _flat(result.plan, cfg)
            pr = result.predicted
            weight = {f"{e.group}/{e.name}": e.bytes for e in result.explain}
            out.append(
                SweepPoint(
                    v,
                    True,
                    pr.tflops_per_device,
                    pr.step_time_s,
                    pr.peak_device_bytes,
                    pr.host_bytes,
                    flat,
                    _changes(last, flat, weight),
                    ref,
                )
            )
            last = flat
        if progress:
            progress(f"{key}={v:g}", 1)
    return out


REFERENCES = ("remat-full", "save-all")


def plan_solver(
    cfg,
    mesh: dict,
    seq: int,
    microbatch: int,
    rates: cm.Rates,
    *,
    schedule: str,
    budget_bytes: float | None,
    host_budget_bytes: float | None,
    segments: bool = False,
) -> Callable[[str, float], tuple]:
    """:func:`request_solver` of the request these arguments make."""
    from tierax.solving import planning

    return request_solver(
        planning.Request(
            cfg,
            mesh,
            rates,
            microbatch=microbatch,
            seq=seq,
            schedule=schedule,
            budget_bytes=budget_bytes,
            host_budget_bytes=host_budget_bytes,
            segments=segments,
        )
    )


def request_solver(request) -> Callable[[str, float], tuple]:
    """The ``solve`` of :func:`sweep` for ``tierax plan --sweep``:
    :func:`tierax.solving.planning.solve` of
    ``request`` (a :class:`tierax.solving.planning.Request`: ``--segments`` included) with the
    swept value replaced, plus the predictions of the :data:`REFERENCES` presets (``fits`` against
    the same budget).  Inventories are traced once per microbatch."""
    from tierax.solving import planner, planning

    inventories: dict[int, object] = {}

    def solve(key: str, value: float):
        if key == "budget":
            req = dataclasses.replace(request, budget_bytes=value * GIB)
        elif key == "microbatch":
            req = dataclasses.replace(request, microbatch=int(value))
        else:
            req = dataclasses.replace(
                request, rates=override_rates(request.rates, [f"{key}={value}"])
            )
        prog = planning.program(req, inventories)
        limit, _ = planner.budgets(req.rates, req.budget_bytes, req.host_budget_bytes)
        refs = {}
        for name in REFERENCES:
            pred = cm.simulate(plan_lib.preset(name, prog), prog, req.rates, req.schedule)
            refs[name] = dataclasses.replace(pred, fits=pred.peak_device_bytes <= limit)
        try:
            result, _ = planning.solve(req, inventories)
        except planner.NoPlanFits:
            result = None
        return result, req.cfg, refs

    return solve
