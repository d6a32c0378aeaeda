"""Measured runs (:class:`Run`): a runs file's entries, each a tierax model on a target with its
mesh, sizes and plan and the step time it was measured at; and each run prepared for the cost
model (:class:`PreparedRun`: traced once, predicted at any factors).

A runs file (YAML)::

    runs:
      - name: llama-8b-a          # unique
        model: llama3.1-8b        # or model_config: FILE (as --model-config), or model_fields
        set: [attention=cudnn]    # optional --set overrides
        target: h100
        mesh: fsdp=8              # or devices: 8 (fsdp=8)
        microbatch: 2
        seq: 4096
        grad_accum: 1             # optional (default 1)
        plan: qkv-offload         # a preset or plan file; or remat: {MaxText remat keys}
        schedule: lhs             # optional (default lhs)
        step_seconds: 1.92        # or maxtext_log: FILE (its `completed step: N, seconds: T` lines)
        skip_steps: 1             # with maxtext_log: the first steps left out (default 1: compile)

A MaxText log's step time is the median of its ``completed step`` lines after the first
``skip_steps`` (MaxText's first step includes the compile).  Paths are relative to the runs file.
A run of another kind (a MaxText configuration, ``maxtext:``) is refused by name: add a loader to
:data:`MODEL_KEYS` to express it.
"""

from __future__ import annotations

import pathlib
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from tierax.errors import TieraxError

RUN_KEYS = (
    "name",
    "model",
    "model_config",
    "model_fields",
    "set",
    "target",
    "mesh",
    "devices",
    "microbatch",
    "seq",
    "grad_accum",
    "plan",
    "remat",
    "schedule",
    "step_seconds",
    "maxtext_log",
    "skip_steps",
)
# How a run names its model: key → what it holds (one of them per run).
MODEL_KEYS = {
    "model": "a named config, as --model",
    "model_config": "a model config file, as --model-config",
    "model_fields": "a model config inline (family plus fields, as in a model config file)",
}
# Run kinds tierax does not express yet: key → what is missing.
NOT_YET = {"maxtext": "a MaxText configuration run (maxtext: CONFIG.yml) is not supported yet"}
STEP_LINE = re.compile(r"completed step:\s*(\d+),\s*seconds:\s*([0-9.eE+-]+)")
DEFAULT_SKIP = 1


@dataclass(frozen=True)
class Run:
    """One measured run: what ran (model, target, mesh, sizes, plan) and its step time."""

    name: str
    target: str
    model_key: str  # one of MODEL_KEYS
    model: object  # its value: a name, a path, or a mapping
    mesh: Mapping[str, int]
    microbatch: int
    seq: int
    measured_s: float
    plan: str | None = None  # a preset or plan file
    remat: Mapping | None = None  # MaxText remat keys
    overrides: tuple[str, ...] = ()
    grad_accum: int = 1
    schedule: str = "lhs"
    time_source: str = "step_seconds"  # where measured_s came from

    def with_measured(self, seconds: float, source: str) -> Run:
        import dataclasses

        return dataclasses.replace(self, measured_s=seconds, time_source=source)


def maxtext_step_seconds(path: str | pathlib.Path, skip: int = DEFAULT_SKIP) -> tuple[float, str]:
    """(median step seconds, how it was read) of a MaxText log's ``completed step: N, seconds: T``
    lines, the first ``skip`` left out.

    Raises:
      TieraxError: the file is missing, has no such line, or none after the skipped ones.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(f"maxtext_log {str(p)!r} is not a file; give the path of a MaxText log")
    steps = [
        (int(m.group(1)), float(m.group(2)))
        for m in STEP_LINE.finditer(p.read_text(errors="replace"))
    ]
    if not steps:
        raise TieraxError(
            f"maxtext_log {str(p)!r} has no 'completed step: N, seconds: T' line; give MaxText's "
            "training log (or the run's step_seconds)"
        )
    kept = steps[skip:]
    if not kept:
        raise TieraxError(
            f"maxtext_log {str(p)!r} has {len(steps)} step line{'s' if len(steps) > 1 else ''}, "
            f"all within skip_steps {skip} (the compile); give a longer log or a smaller skip_steps"
        )
    median = statistics.median(t for _, t in kept)
    how = (
        f"{p.name}: median of {len(kept)} step{'s' if len(kept) > 1 else ''} "
        f"({kept[0][0]}..{kept[-1][0]}; the first {skip} skipped)"
    )
    return median, how


def _whole(v, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TieraxError(f"{where}: {name} is {v!r}; give a whole number ≥ {minimum}")
    return v


def parse_run(entry, where: str, base: pathlib.Path) -> Run:
    """One runs-file entry as a :class:`Run` (``base``: the runs file's directory).

    Raises:
      TieraxError: not a mapping, an unknown key, no name, no or two model keys, no target, no
        plan, neither or both of step_seconds and maxtext_log, a bad size, or a log without steps.
    """
    from tierax import hardware
    from tierax.costmodel import SCHEDULES
    from tierax.mesh import parse_mesh

    if not isinstance(entry, dict):
        raise TieraxError(
            f"{where} is not a mapping; give the run's fields ({', '.join(RUN_KEYS)})"
        )
    for key, why in NOT_YET.items():
        if key in entry:
            raise TieraxError(f"{where}: {why}; give model, model_config or model_fields")
    unknown = [k for k in entry if k not in RUN_KEYS]
    if unknown:
        raise TieraxError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f"; a run's keys: {', '.join(RUN_KEYS)}"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise TieraxError(f"{where}: no name; give each run a unique name")
    where = f"{where} ({name})"
    models = [k for k in MODEL_KEYS if k in entry]
    if len(models) != 1:
        raise TieraxError(
            f"{where}: give exactly one of "
            + "; ".join(f"{k} ({v})" for k, v in MODEL_KEYS.items())
            + (f" (got {', '.join(models)})" if models else "")
        )
    model = entry[models[0]]
    if models[0] == "model_config":
        model = str(base / str(model))
    elif models[0] == "model_fields" and not isinstance(model, dict):
        raise TieraxError(f"{where}: model_fields must be a mapping (family plus config fields)")
    target = entry.get("target")
    if not isinstance(target, str):
        raise TieraxError(f"{where}: no target; give one (e.g. h100, v6e)")
    hardware.get_target(target) if target != "cpu" else None
    overrides = entry.get("set", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise TieraxError(f"{where}: set must be a list of KEY=VALUE strings")
    devices = entry.get("devices")
    if devices is not None:
        _whole(devices, "devices", where)
    mesh = parse_mesh(entry.get("mesh"), devices, option=f"{where} mesh").to_dict()
    sizes = {k: _whole(entry.get(k), k, where) for k in ("microbatch", "seq")}
    accum = _whole(entry.get("grad_accum", 1), "grad_accum", where)
    schedule = entry.get("schedule", "lhs")
    if schedule not in SCHEDULES:
        raise TieraxError(f"{where}: schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if ("plan" in entry) == ("remat" in entry):
        raise TieraxError(
            f"{where}: give exactly one of plan (a preset or plan file) and remat (MaxText remat "
            "keys, e.g. {remat_policy: custom, query_proj: offload})"
        )
    plan, remat = entry.get("plan"), entry.get("remat")
    if plan is not None:
        if not isinstance(plan, str):
            raise TieraxError(f"{where}: plan must be a preset name or a plan file's path")
        plan = plan if not (base / plan).is_file() else str(base / plan)
    if remat is not None and not isinstance(remat, dict):
        raise TieraxError(f"{where}: remat must be a mapping of MaxText remat keys")
    has_time, has_log = "step_seconds" in entry, "maxtext_log" in entry
    if has_time == has_log:
        raise TieraxError(
            f"{where}: give exactly one of step_seconds (the measured step time) and maxtext_log "
            "(a MaxText log whose 'completed step' lines give it)"
        )
    if "skip_steps" in entry and not has_log:
        raise TieraxError(f"{where}: skip_steps applies to maxtext_log only")
    if has_time:
        t = entry["step_seconds"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise TieraxError(f"{where}: step_seconds is {t!r}; give the measured seconds (> 0)")
        seconds, source = float(t), "step_seconds"
    else:
        skip = _whole(entry.get("skip_steps", DEFAULT_SKIP), "skip_steps", where, minimum=0)
        seconds, source = maxtext_step_seconds(base / str(entry["maxtext_log"]), skip)
    return Run(
        name=name,
        target=target,
        model_key=models[0],
        model=model,
        mesh=mesh,
        microbatch=sizes["microbatch"],
        seq=sizes["seq"],
        measured_s=seconds,
        plan=plan,
        remat=remat,
        overrides=tuple(overrides),
        grad_accum=accum,
        schedule=schedule,
        time_source=source,
    )


def read_runs_document(path: pathlib.Path, option: str, example: str, like: str) -> dict:
    """A runs file's YAML as a mapping with a non-empty ``runs`` list (what ``tierax calibrate
    --runs`` and ``bench/published_runs.py --data`` read); ``option`` names it in the errors,
    ``example`` and ``like`` say what to give instead.

    Raises:
      TieraxError: the file is missing or not YAML, or has no non-empty ``runs`` list.
    """
    if not path.is_file():
        raise TieraxError(f"{option} {str(path)!r} is not a file; give a runs file {example}")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise TieraxError(f"{option} {str(path)!r} is not YAML ({e}); fix the file") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise TieraxError(f"{option} {str(path)!r}: needs a non-empty 'runs' list{like}")
    return data


def load_runs(path: str | pathlib.Path) -> list[Run]:
    """The runs of a runs file, every entry checked (logs read) before any is traced.

    Raises:
      TieraxError: the file is missing or not YAML, has no non-empty ``runs`` list or another
        top-level key, a run is invalid (:func:`parse_run`), or a name repeats.
    """
    p = pathlib.Path(path)
    data = read_runs_document(p, "--runs", "(YAML: runs: [...])", "")
    extra = [k for k in data if k != "runs"]
    if extra:
        raise TieraxError(
            f"--runs {str(p)!r}: unknown top-level key {', '.join(map(repr, extra))}; the file "
            "holds 'runs' only"
        )
    runs = [
        parse_run(e, f"--runs {p.name} runs[{i}]", p.parent) for i, e in enumerate(data["runs"])
    ]
    seen: set[str] = set()
    for r in runs:
        if r.name in seen:
            raise TieraxError(f"--runs {str(p)!r}: run name {r.name!r} appears twice; rename one")
        seen.add(r.name)
    return runs


# Predictions a prepared run keeps by factors (a fit evaluates thousands of factor sets).
PREDICTIONS_KEPT = 4096


@dataclass(frozen=True)
class PreparedRun:
    """A run traced for the cost model: its config, plan, inventory and uncalibrated rates."""

    run: Run
    cfg: object
    plan: object
    inventory: object
    rates: object
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def predict(self, factors: Mapping[str, float] | None = None):
        """The cost model's :class:`~tierax.costmodel.Prediction` of the run with ``factors``
        (resource → factor) applied to its target's rates."""
        from tierax import costmodel as cm

        key = tuple(sorted((factors or {}).items()))
        hit = self._cache.get(key)
        if hit is None:
            rates = cm.scale_rates(self.rates, dict(factors or {})) if factors else self.rates
            hit = cm.simulate(
                self.plan, self.program, rates, self.run.schedule, self.run.grad_accum
            )
            if len(self._cache) >= PREDICTIONS_KEPT:  # full: the predictions go, the program stays
                program = self._cache["program"]
                self._cache.clear()
                self._cache["program"] = program
            self._cache[key] = hit
        return hit

    @property
    def program(self):
        """The run's :class:`~tierax.tracing.program.Program` (tierax's front end)."""
        from tierax.tracing.model_program import for_inventory

        if "program" not in self._cache:
            self._cache["program"] = for_inventory(self.cfg, self.inventory)
        return self._cache["program"]

    def step_s(self, factors: Mapping[str, float] | None = None) -> float:
        return self.predict(factors).step_time_s


def build_config(model_key: str, model, overrides, platform: str, source: str):
    """A model config named as a run names it (``model_key`` of :data:`MODEL_KEYS` and its value),
    ``overrides`` applied and ``attention: auto`` chosen for ``platform``."""
    from tierax.interop.files import load_model_config
    from tierax.models import apply_overrides, config_from_dict, for_platform, get_config

    if model_key == "model":
        cfg = get_config(str(model))
    elif model_key == "model_config":
        cfg = load_model_config(str(model))
    else:
        cfg = config_from_dict(dict(model), source=source)
    return for_platform(apply_overrides(cfg, list(overrides)), platform)


def model_config(run: Run):
    """The run's model config (:func:`build_config`) for its target's platform."""
    from tierax import hardware

    platform = hardware.platform(run.target)
    return build_config(run.model_key, run.model, run.overrides, platform, f"run {run.name}")


def remat_plan(remat: Mapping, cfg, platform: str, source: str):
    """The tierax plan MaxText remat keys (``remat_policy: custom`` and per-name placements, as a
    MaxText config writes them) describe for ``cfg`` on ``platform``."""
    from tierax import plan as plan_lib
    from tierax.interop import maxtext_keys

    groups = {g.name: g.activations for g in cfg.layer_groups()}
    data = {"hardware": platform, **remat}
    return plan_lib.Plan.from_dict(maxtext_keys.plan_dict(data, groups, source=source))


def config_and_plan(run: Run):
    """The run's model config (:func:`model_config`) and plan: its MaxText remat keys
    (:func:`remat_plan`) or its plan file or preset."""
    from tierax import hardware
    from tierax.interop import files

    cfg = model_config(run)
    if run.remat is not None:
        return cfg, remat_plan(run.remat, cfg, hardware.platform(run.target), run.name)
    return cfg, files.load_plan(run.plan, cfg)


def prepare(run: Run, calibration: dict | None = None) -> PreparedRun:
    """Trace ``run`` for the cost model (JAX must be started: :func:`tierax.launch.start`).
    ``calibration``: the measured-rates file's content to use (None: the one on this machine)."""
    from tierax import costmodel as cm
    from tierax.tracing import inventory as inv_lib

    cfg, plan = config_and_plan(run)
    inv = inv_lib.model_inventory(cfg, run.microbatch, run.seq, dict(run.mesh))
    rates = cm.target_rates(run.target, cfg.dtype, calibration)
    return PreparedRun(run, cfg, plan, inv, rates)
