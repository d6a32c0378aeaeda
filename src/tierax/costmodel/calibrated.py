"""A calibration from measured runs (:class:`CalibratedRates`, the RATES.yaml that ``tierax
calibrate --runs`` writes and ``--rates`` reads): per target kind or platform, a factor for some of
the step's resources (:mod:`tierax.costmodel.resources`), with the runs it was fitted from and
their leave-one-out errors.

Applying it (:meth:`CalibratedRates.apply`) divides the target's rates of each calibrated resource
by its factor and says so in the rates' ``calibration`` source: which factors, fitted on how many
runs, from which file.  A target with no factor set of its own kind uses its platform's (``gpu``,
``tpu``); a target with neither is left uncalibrated, and the source line says that too.
"""

from __future__ import annotations

import math
import pathlib
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from tierax import hardware
from tierax.costmodel.rates import Rates
from tierax.costmodel.resources import RESOURCES, check_resources, scale_rates
from tierax.errors import TieraxError

FORMAT = "tierax.calibrated_rates/1"
PLATFORMS = ("gpu", "tpu", "cpu")
TOP_KEYS = ("format", "tierax", "created", "command", "schedule", "method", "groups")
GROUP_KEYS = ("factors", "runs", "clamped", "loo")
LOO_KEYS = ("measured_s", "uncalibrated_s", "loo_s", "fitted_s")


@dataclass(frozen=True)
class RunError:
    """One fitted run: measured and predicted step seconds (uncalibrated; calibrated by the factors
    fitted without the run: leave-one-out; calibrated by the factors fitted with it)."""

    measured_s: float
    uncalibrated_s: float
    loo_s: float
    fitted_s: float

    def error(self, which: str) -> float:
        """Relative error of ``which`` (``uncalibrated``, ``loo``, ``fitted``): predicted /
        measured − 1."""
        s = {"uncalibrated": self.uncalibrated_s, "loo": self.loo_s, "fitted": self.fitted_s}[which]
        return s / self.measured_s - 1


@dataclass(frozen=True)
class FactorSet:
    """The factors of one target kind or platform (resource → factor; resources not listed are
    not calibrated), the runs fitted (name → :class:`RunError`, in order) and the factors that
    stopped at the fit's bounds."""

    factors: Mapping[str, float]
    runs: Mapping[str, RunError]
    clamped: tuple[str, ...] = ()

    def median_abs_error(self, which: str) -> float:
        """The median |relative error| of ``which`` (:meth:`RunError.error`) over the runs."""
        return statistics.median(abs(r.error(which)) for r in self.runs.values())


@dataclass(frozen=True)
class CalibratedRates:
    """Factor sets by target kind (``h100``) or platform (``gpu``), and how they were made."""

    groups: Mapping[str, FactorSet]
    schedule: str = "lhs"
    method: str = ""
    tierax: Mapping[str, str | None] = field(default_factory=dict)
    created: str = ""
    command: str = ""
    source: str = ""  # the file it was read from ("" when built in memory)

    def factor_set(self, target: str) -> tuple[str, FactorSet] | None:
        """(group key, factor set) for ``target``: its kind's, else its platform's, else None."""
        if target in self.groups:
            return target, self.groups[target]
        platform = hardware.platform(target)
        if platform in self.groups:
            return platform, self.groups[platform]
        return None

    def describe(self, target: str) -> str:
        """The rates line's ``calibration`` entry for ``target``."""
        where = f" ({self.source})" if self.source else ""
        found = self.factor_set(target)
        if found is None:
            return (
                f"none for {target}{where}: it calibrates {', '.join(self.groups)} only; "
                "uncalibrated rates"
            )
        key, fs = found
        shown = ", ".join(f"{r} ×{fs.factors[r]:.3g}" for r in RESOURCES if r in fs.factors)
        rest = [r for r in RESOURCES if r not in fs.factors]
        return (
            f"{shown} (time × factor), fitted on {len(fs.runs)} {key} run"
            f"{'s' if len(fs.runs) != 1 else ''}{where}"
            + (f"; not calibrated: {', '.join(rest)}" if rest else "")
            + (f"; at the fit's bound: {', '.join(fs.clamped)}" if fs.clamped else "")
        )

    def apply(self, rates: Rates) -> Rates:
        """``rates`` with the factors for its target applied, and the ``calibration`` source."""
        found = self.factor_set(rates.target)
        factors = dict(found[1].factors) if found else {}
        return scale_rates(rates, factors, note=self.describe(rates.target))

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "tierax": dict(self.tierax),
            "created": self.created,
            "command": self.command,
            "schedule": self.schedule,
            "method": self.method,
            "groups": {
                k: {
                    "factors": {r: float(fs.factors[r]) for r in RESOURCES if r in fs.factors},
                    "runs": list(fs.runs),
                    "clamped": list(fs.clamped),
                    "loo": {
                        name: {
                            "measured_s": float(e.measured_s),
                            "uncalibrated_s": float(e.uncalibrated_s),
                            "loo_s": float(e.loo_s),
                            "fitted_s": float(e.fitted_s),
                        }
                        for name, e in fs.runs.items()
                    },
                }
                for k, fs in self.groups.items()
            },
        }

    def to_yaml(self) -> str:
        return (
            "# tierax calibrated rates: per target kind or platform, a factor multiplies the time "
            "of its\n# resource (its rates divided by it); use with --rates FILE. loo_s: each "
            "run predicted by the\n# factors fitted without it.\n"
            + yaml.safe_dump(self.to_dict(), sort_keys=False, width=100)
        )


def _fail(source: str, msg: str) -> TieraxError:
    return TieraxError(f"--rates {source!r}: {msg}")


def _number(v, source: str, where: str, *, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _fail(source, f"{where} is {v!r}; give a finite number")
    if positive and v <= 0:
        raise _fail(source, f"{where} is {v!r}; give a number > 0")
    return float(v)


def _unknown(keys, allowed, source: str, where: str) -> None:
    extra = [k for k in keys if k not in allowed]
    if extra:
        raise _fail(
            source,
            f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} in {where}; "
            f"allowed: {', '.join(allowed)} (write the file with `tierax calibrate --runs`)",
        )


def from_dict(data, source: str = "") -> CalibratedRates:
    """The :class:`CalibratedRates` of a parsed RATES.yaml.

    Raises:
      TieraxError: not a mapping of this format, an unknown key anywhere, a group that is neither
        a target kind nor a platform, an unknown resource, a factor or time that is not a number
        > 0, a run listed without its errors.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _fail(
            source,
            f"not a calibration file (format: {FORMAT}); write one with "
            "`tierax calibrate --runs RUNS.yaml --out RATES.yaml`",
        )
    _unknown(data, TOP_KEYS, source, "the file")
    groups_in = data.get("groups")
    if not isinstance(groups_in, dict) or not groups_in:
        raise _fail(source, "'groups' must map a target kind or platform to its factors")
    known = set(hardware.TARGETS) | set(hardware.TPU_TARGETS) | set(PLATFORMS)
    groups = {}
    for key, g in groups_in.items():
        if key not in known:
            raise _fail(
                source,
                f"group {key!r} is neither a target kind nor a platform; use one of "
                f"{', '.join(sorted(known))}",
            )
        if not isinstance(g, dict):
            raise _fail(source, f"group {key!r} must be a mapping with {', '.join(GROUP_KEYS)}")
        _unknown(g, GROUP_KEYS, source, f"group {key!r}")
        factors = g.get("factors")
        if not isinstance(factors, dict) or not factors:
            raise _fail(source, f"group {key!r} has no 'factors' (resource: factor)")
        try:
            check_resources(factors, f"group {key!r}")
        except TieraxError as e:
            raise _fail(source, str(e)) from None
        factors = {r: _number(v, source, f"{key} factor {r}") for r, v in factors.items()}
        names, loo = g.get("runs") or [], g.get("loo") or {}
        if not isinstance(names, list) or not isinstance(loo, dict) or set(names) != set(loo):
            raise _fail(source, f"group {key!r}: 'runs' and 'loo' must list the same runs")
        runs = {}
        for name in names:
            e = loo[name]
            if not isinstance(e, dict):
                raise _fail(source, f"group {key!r} run {name!r}: give {', '.join(LOO_KEYS)}")
            _unknown(e, LOO_KEYS, source, f"group {key!r} run {name!r}")
            vals = {k: _number(e.get(k), source, f"{key} run {name} {k}") for k in LOO_KEYS}
            runs[str(name)] = RunError(**vals)
        clamped = g.get("clamped") or []
        if not isinstance(clamped, list) or any(c not in factors for c in clamped):
            raise _fail(source, f"group {key!r}: 'clamped' must list fitted factors")
        groups[key] = FactorSet(factors, runs, tuple(clamped))
    return CalibratedRates(
        groups=groups,
        schedule=str(data.get("schedule", "lhs")),
        method=str(data.get("method", "")),
        tierax=dict(data.get("tierax") or {}),
        created=str(data.get("created", "")),
        command=str(data.get("command", "")),
        source=source,
    )


def load(path: str | pathlib.Path) -> CalibratedRates:
    """Read a RATES.yaml (:func:`from_dict`).

    Raises:
      TieraxError: the file is missing, not YAML, or not a valid calibration.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(
            f"--rates {str(p)!r} is not a file; write one with `tierax calibrate --runs RUNS.yaml "
            f"--out {p.name}`"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise TieraxError(f"--rates {str(p)!r} is not YAML ({e}); fix or rewrite it") from None
    return from_dict(data, str(path))
