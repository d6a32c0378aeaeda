"""The training run configuration: one YAML file, typed and validated on load.

A config file is a mapping of the top-level keys of :class:`TrainConfig`, with
nested sections (``mesh``, ``optimizer``, ``data``, ``checkpoint``, ``log``,
``runtime``, ``debug``)::

    model: tiny-deepseek          # a named config, or an inline model config mapping
    plan: minimal                 # a preset, a plan YAML file, or an inline plan mapping
    microbatch: 8                 # sequences per device (or global_batch: N)
    seq: 128
    steps: 60
    mesh: {data: 1, fsdp: 2}
    optimizer: {lr: 0.01, warmup_steps: 5}
    data: {source: tokens, path: runs/demo/data}
    checkpoint: {every: 20, keep: 2}
    log: {dir: runs/demo/train}

Command-line overrides are ``KEY=VALUE`` with dotted keys for sections
(``mesh.fsdp=4``, ``optimizer.lr=3e-4``) and for fields of the model
(``model.d_model=128``, applied to a named or inline model).  Values are read as
YAML scalars.  Every problem is a :class:`~tierax.errors.TieraxError` that names
the key and the valid choices.  Relative paths are relative to the working
directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import pathlib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tierax import plan as plan_lib
from tierax import xla_flags
from tierax.errors import TieraxError
from tierax.mesh import BATCH_AXES, MeshShape
from tierax.models import ModelConfig, apply_overrides, config_from_dict, config_to_dict, get_config
from tierax.models.config import _coerce  # the one scalar type check, shared with model configs

COMPUTE_DTYPES = ("model", "float32", "bfloat16")
DATA_SOURCES = ("synthetic", "tokens")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TieraxError(msg)


# --- sections -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW with linear warm-up then cosine decay (``optax.warmup_cosine_decay_schedule``).

    The learning rate rises from 0 to ``lr`` over ``warmup_steps``, then decays to
    ``lr × end_lr_ratio`` at ``decay_steps`` (default: the run's ``steps``).
    """

    lr: float = 3e-3
    warmup_steps: int = 10
    decay_steps: int | None = None
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        _check(self.warmup_steps >= 0, f"optimizer.warmup_steps must be ≥ 0, got {self.warmup_steps}")
        _check(0 <= self.end_lr_ratio <= 1, f"optimizer.end_lr_ratio must be in [0, 1], got {self.end_lr_ratio}")
        _check(self.weight_decay >= 0, f"optimizer.weight_decay must be ≥ 0, got {self.weight_decay}")
        for key in ("b1", "b2"):
            _check(0 <= getattr(self, key) < 1, f"optimizer.{key} must be in [0, 1), got {getattr(self, key)}")
        _check(self.eps > 0, f"optimizer.eps must be > 0, got {self.eps}")
        _check(self.grad_clip is None or self.grad_clip > 0,
               f"optimizer.grad_clip must be > 0 or null (no clipping), got {self.grad_clip}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """``synthetic``: uniform random tokens; ``tokens``: a directory written by
    ``tierax data prepare`` (byte-level tokens, vocabulary 256)."""

    source: str = "synthetic"
    path: str | None = None

    def __post_init__(self) -> None:
        _check(self.source in DATA_SOURCES,
               f"data.source={self.source!r} is not a data source; use one of: {', '.join(DATA_SOURCES)}")
        if self.source == "tokens":
            _check(self.path is not None,
                   "data.source is tokens but data.path is not set; give the directory `tierax data prepare` wrote")
        else:
            _check(self.path is None, "data.path is set but data.source is synthetic; set data.source: tokens")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Orbax checkpoints every ``every`` steps and at the last step (``every: 0``: none);
    the ``keep`` most recent are kept.  ``dir`` defaults to ``<log.dir>/checkpoints``."""

    dir: str | None = None
    every: int = 100
    keep: int = 3
    async_save: bool = True

    def __post_init__(self) -> None:
        _check(self.every >= 0, f"checkpoint.every must be ≥ 0 (0: no checkpoints), got {self.every}")
        _check(self.keep >= 1, f"checkpoint.keep must be ≥ 1, got {self.keep}")


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """``dir`` receives ``metrics.jsonl`` (one JSON object per step), the resolved
    config and ``metrics.png``; a progress line is printed every ``every`` steps."""

    dir: str = "runs/train"
    every: int = 10
    plot: bool = True

    def __post_init__(self) -> None:
        _check(self.every >= 1, f"log.every must be ≥ 1, got {self.every}")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """GPU runtime memory settings derived at start-up (ignored on CPU).

    ``device_budget_gb`` with ``target`` sets ``XLA_PYTHON_CLIENT_MEM_FRACTION``;
    ``host_budget_gb`` (default: the plan's offloaded bytes with headroom) sets
    ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB``.
    """

    target: str | None = None
    device_budget_gb: float | None = None
    host_budget_gb: float | None = None

    def __post_init__(self) -> None:
        if self.target is not None:
            from tierax import hardware

            hardware.get_target(self.target)
        _check(self.device_budget_gb is None or self.device_budget_gb > 0,
               f"runtime.device_budget_gb must be > 0, got {self.device_budget_gb}")
        _check(self.host_budget_gb is None or self.host_budget_gb > 0,
               f"runtime.host_budget_gb must be > 0, got {self.host_budget_gb}")
        _check(self.device_budget_gb is None or self.target is not None,
               "runtime.device_budget_gb needs runtime.target (its device memory size) to become a memory fraction")


@dataclass(frozen=True, kw_only=True)
class DebugConfig:
    """TEST-ONLY knobs.  ``nan_at_step``: the parameters are poisoned with NaN just
    before that step, so its loss is NaN (exercises the divergence stop);
    ``step_delay_s``: sleep after each step (gives tests a window to kill a run)."""

    nan_at_step: int | None = None
    step_delay_s: float = 0.0

    def __post_init__(self) -> None:
        _check(self.nan_at_step is None or self.nan_at_step >= 1,
               f"debug.nan_at_step must be ≥ 1, got {self.nan_at_step}")
        _check(self.step_delay_s >= 0, f"debug.step_delay_s must be ≥ 0, got {self.step_delay_s}")


SECTIONS: dict[str, type] = {
    "mesh": MeshShape,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "checkpoint": CheckpointConfig,
    "log": LogConfig,
    "runtime": RuntimeConfig,
    "debug": DebugConfig,
}


# --- the run --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A resolved, validated training run.

    Attributes:
      model: the model (``compute_dtype`` already applied).
      plan: the activation plan, validated against ``model``.
      microbatch: sequences per device per microbatch (the project-wide meaning).
      seq: tokens per sequence.
      grad_accum: microbatches per optimizer step.
      steps: optimizer steps of the whole run (a resumed run continues to it).
      seed: parameter initialisation and data order.
      cpu_devices: host CPU devices per process (CPU backend; default: the mesh
        size over the process count).
      xla_preset: a key of :data:`tierax.xla_flags.PRESETS`.
      source: where the config came from (for messages).
    """

    model: ModelConfig
    plan: plan_lib.Plan
    microbatch: int = 8
    seq: int = 64
    grad_accum: int = 1
    steps: int = 100
    seed: int = 0
    cpu_devices: int | None = None
    xla_preset: str = "none"
    mesh: MeshShape = field(default_factory=MeshShape)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    source: str = "config"

    def __post_init__(self) -> None:
        for key in ("microbatch", "seq", "steps"):
            _check(getattr(self, key) >= 1, f"{self.source}: {key} must be ≥ 1, got {getattr(self, key)}")
        _check(self.grad_accum >= 1,
               f"{self.source}: grad_accum must be ≥ 1 (1: no accumulation), got {self.grad_accum}")
        _check(self.seed >= 0, f"{self.source}: seed must be ≥ 0, got {self.seed}")
        _check(self.xla_preset in xla_flags.PRESETS,
               f"{self.source}: xla_preset={self.xla_preset!r} is unknown; choose one of: {', '.join(xla_flags.PRESETS)}")
        self.mesh.check_model(self.model, where=f"{self.source}: mesh")
        if self.cpu_devices is not None:
            _check(self.cpu_devices >= 1, f"{self.source}: cpu_devices must be ≥ 1, got {self.cpu_devices}")
        decay = self.decay_steps
        _check(self.optimizer.warmup_steps < decay,
               f"{self.source}: optimizer.warmup_steps={self.optimizer.warmup_steps} must be below the decay "
               f"horizon ({decay} = optimizer.decay_steps or steps)")
        _check(self.debug.nan_at_step is None or self.debug.nan_at_step <= self.steps,
               f"{self.source}: debug.nan_at_step={self.debug.nan_at_step} is after the last step {self.steps}")
        plan_lib.resolve(self.plan, self.model)

    @property
    def global_batch(self) -> int:
        """Sequences per microbatch over all devices: microbatch × the mesh's batch axes."""
        return self.microbatch * self.mesh.batch_ways

    @property
    def batch_per_step(self) -> int:
        """Sequences per optimizer step: global batch × grad_accum."""
        return self.global_batch * self.grad_accum

    @property
    def decay_steps(self) -> int:
        return self.optimizer.decay_steps if self.optimizer.decay_steps is not None else self.steps

    @property
    def checkpoint_dir(self) -> pathlib.Path | None:
        if self.checkpoint.every == 0:
            return None
        return pathlib.Path(self.checkpoint.dir or os.path.join(self.log.dir, "checkpoints"))

    def to_dict(self) -> dict[str, Any]:
        """The loadable form: model and plan inline, every section spelled out."""
        out: dict[str, Any] = {"model": config_to_dict(self.model), "plan": self.plan.to_dict()}
        for f in dataclasses.fields(self):
            if f.name in ("model", "plan", "source"):
                continue
            v = getattr(self, f.name)
            out[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        return out

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed by it: the model
        (not its name), the optimizer, the batch, the data and the seed.  The plan,
        mesh, step count, logging and debug knobs may change between runs."""
        model = config_to_dict(self.model)
        model.pop("name")
        opt = dataclasses.asdict(self.optimizer)
        opt["decay_steps"] = self.decay_steps
        return {
            "model": model,
            "optimizer": opt,
            "seq": self.seq,
            "batch_per_step": self.batch_per_step,
            "seed": self.seed,
            "data": {"source": self.data.source},  # the trainer adds the data's own identity (its hash)
        }


# --- loading --------------------------------------------------------------------

_TOP_KEYS = ("model", "plan", "microbatch", "global_batch", "seq", "grad_accum", "steps", "seed",
             "compute_dtype", "cpu_devices", "xla_preset", *SECTIONS)


def valid_keys() -> list[str]:
    """Every config key, sections dotted (``mesh.fsdp``)."""
    out = []
    for k in _TOP_KEYS:
        if k in SECTIONS:
            out += [f"{k}.{f.name}" for f in dataclasses.fields(SECTIONS[k])]
        else:
            out.append(k)
    return out


def _unknown(keys: Sequence[str], valid: Sequence[str], where: str, prefix: str = "") -> TieraxError:
    hint = ""
    if len(keys) == 1:
        close = difflib.get_close_matches(str(keys[0]), list(valid), n=1)
        hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
    return TieraxError(
        f"{where}: unknown key{'s' if len(keys) > 1 else ''} {', '.join(repr(prefix + str(k)) for k in keys)}{hint}; "
        f"valid keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(prefix + v for v in valid)}"
    )


def _typed(cls: type) -> dict[str, tuple[type, bool]]:
    """Field → (scalar type, accepts None)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        optional = isinstance(t, types.UnionType) and type(None) in t.__args__
        if optional:
            t = next(a for a in t.__args__ if a is not type(None))
        out[f.name] = (t, optional)
    return out


def _value(key: str, value: Any, expected: tuple[type, bool], where: str) -> Any:
    typ, optional = expected
    if value is None:
        if optional:
            return None
        raise TieraxError(f"{where}: {key} must not be null")
    if isinstance(value, (Mapping, list)):
        raise TieraxError(f"{where}: {key} expects a single {typ.__name__}, got {type(value).__name__} {value!r}")
    return _coerce(key, value, typ, where)


def _section(name: str, raw: Any, where: str):
    cls = SECTIONS[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise TieraxError(f"{where}: {name} must be a mapping of {', '.join(f.name for f in dataclasses.fields(cls))}")
    fields = _typed(cls)
    unknown = [k for k in raw if k not in fields]
    if unknown:
        raise _unknown(unknown, list(fields), where, prefix=f"{name}.")
    values = {k: _value(f"{name}.{k}", v, fields[k], where) for k, v in raw.items()}
    try:
        return cls(**values)
    except TieraxError as e:
        raise TieraxError(f"{where}: {e}") from None


def _model(raw: Any, model_overrides: Sequence[str], compute_dtype: str, where: str) -> ModelConfig:
    if isinstance(raw, str):
        cfg = get_config(raw)
    elif isinstance(raw, Mapping):
        cfg = config_from_dict(raw, source=f"{where}: model")
    else:
        raise TieraxError(
            f"{where}: model must be a named config (see `tierax models`) or a model config mapping "
            "(`tierax models show NAME` prints one)"
        )
    cfg = apply_overrides(cfg, model_overrides)
    if compute_dtype != "model":
        # Mixed precision: compute in compute_dtype, float32 master weights (and optimizer state).
        cfg = dataclasses.replace(cfg, dtype=compute_dtype, param_dtype="float32")
    return cfg


def _plan(raw: Any, cfg: ModelConfig, where: str) -> plan_lib.Plan:
    if isinstance(raw, Mapping):
        return plan_lib.load_plan(plan_lib.Plan.from_dict(raw, source=f"{where}: plan"), cfg)
    if not isinstance(raw, str):
        raise TieraxError(f"{where}: plan must be a preset ({', '.join(plan_lib.PRESETS)}), a plan file or a plan mapping")
    return plan_lib.load_plan(raw, cfg)


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``KEY=VALUE`` strings → (dotted key split, YAML scalar value)."""
    out = []
    for text in overrides:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise TieraxError(f"override {text!r}: expected KEY=VALUE, e.g. steps=100 or mesh.fsdp=4")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        out.append((key.split("."), value))
    return out


def config_from_mapping(data: Any, overrides: Sequence[str] = (), *, source: str = "config") -> TrainConfig:
    """Validate a config mapping (as read from YAML), ``overrides`` applied in order.

    Raises:
      TieraxError: not a mapping, an unknown key (valid keys listed), a wrong type,
        or inconsistent values.
    """
    if not isinstance(data, Mapping):
        raise TieraxError(f"{source}: a train config must be a mapping of keys to values; valid keys: "
                          + ", ".join(_TOP_KEYS))
    data = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    model_overrides: list[str] = []
    for (path, value), text in zip(parse_overrides(overrides), overrides):
        head = path[0]
        if head == "model" and len(path) == 2 and not isinstance(data.get("model"), Mapping):
            model_overrides.append(f"{path[1]}={text.partition('=')[2]}")  # onto the named config
        elif len(path) == 1:
            data[head] = value
        elif len(path) == 2 and (head in SECTIONS or head == "model"):
            section = data.get(head)
            data[head] = {**(section if isinstance(section, Mapping) else {}), path[1]: value}
        elif head in SECTIONS or head == "model":
            raise TieraxError(f"override {text!r}: sections are one level deep, e.g. {head}.KEY=VALUE")
        else:
            raise _unknown([".".join(path)], valid_keys(), f"override {text!r}")

    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise _unknown(unknown, valid_keys(), source)
    scalars: dict[str, tuple[type, bool]] = {
        "microbatch": (int, True), "global_batch": (int, True), "seq": (int, False), "grad_accum": (int, False),
        "steps": (int, False), "seed": (int, False), "compute_dtype": (str, False), "cpu_devices": (int, True),
        "xla_preset": (str, False),
    }
    values = {k: _value(k, data[k], t, source) for k, t in scalars.items() if k in data}
    compute_dtype = values.pop("compute_dtype", "model")
    _check(compute_dtype in COMPUTE_DTYPES,
           f"{source}: compute_dtype={compute_dtype!r} is unknown; use one of: {', '.join(COMPUTE_DTYPES)} "
           "(model: the model config's own dtype)")
    if "model" not in data:
        raise TieraxError(f"{source}: 'model' is required: a named config (see `tierax models`) or a model mapping")
    sections = {name: _section(name, data.get(name), source) for name in SECTIONS}
    mesh = sections["mesh"]

    # global_batch is an alternative spelling of the per-device microbatch.
    ways = "×".join(BATCH_AXES)
    microbatch, global_batch = values.pop("microbatch", None), values.pop("global_batch", None)
    if global_batch is not None:
        _check(global_batch >= 1, f"{source}: global_batch must be ≥ 1, got {global_batch}")
        _check(global_batch % mesh.batch_ways == 0,
               f"{source}: global_batch {global_batch} is not divisible by {ways} = {mesh.batch_ways}; "
               f"use a multiple of {mesh.batch_ways}, or set microbatch (sequences per device) instead")
        _check(microbatch is None or microbatch * mesh.batch_ways == global_batch,
               f"{source}: microbatch {microbatch} × {ways} {mesh.batch_ways} = {(microbatch or 0) * mesh.batch_ways} "
               f"≠ global_batch {global_batch}; give one of them")
        microbatch = global_batch // mesh.batch_ways
    if microbatch is not None:
        values["microbatch"] = microbatch

    try:
        model = _model(data["model"], model_overrides, compute_dtype, source)
        plan = _plan(data.get("plan", "save-all"), model, source)
    except TieraxError as e:
        msg = str(e)
        raise TieraxError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    cfg = TrainConfig(model=model, plan=plan, source=source, **values, **sections)
    return cfg


def load_train_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a train config YAML file, then apply ``overrides``.

    Raises:
      TieraxError: the file is missing or not YAML, or the config is invalid
        (see :func:`config_from_mapping`).
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(f"train config {str(path)!r} does not exist; see configs/demo-train.yaml for an example")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TieraxError(f"{p}: cannot be read as YAML ({e})") from None
    return config_from_mapping(data, overrides, source=str(p))


def config_to_yaml(cfg: TrainConfig) -> str:
    """``cfg.to_dict()`` as YAML: a file :func:`load_train_config` reads back to ``cfg``."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# --- processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Distributed:
    """How this process joins a multi-process run (``jax.distributed``).

    Attributes:
      coordinator: ``host:port`` of process 0's coordination service.
      num_processes: processes in the run.
      process_id: this process, 0-based.
    """

    coordinator: str
    num_processes: int
    process_id: int

    ENV = ("TIERAX_COORDINATOR", "TIERAX_NUM_PROCESSES", "TIERAX_PROCESS_ID")

    @classmethod
    def resolve(cls, coordinator: str | None, num_processes: int | None, process_id: int | None,
                environ: Mapping[str, str] | None = None) -> "Distributed | None":
        """From flags, else the ``TIERAX_*`` environment; None for a single-process run.

        Raises:
          TieraxError: only some of the three are given, or they are inconsistent.
        """
        env = os.environ if environ is None else environ
        given = [coordinator, num_processes, process_id]
        names = ["--coordinator", "--num-processes", "--process-id"]
        for i, var in enumerate(cls.ENV):
            if given[i] is None and env.get(var):
                given[i] = env[var]
                names[i] = var
        if all(g is None for g in given):
            return None
        missing = [f"{n} (or {v})" for g, n, v in zip(given, names, cls.ENV) if g is None]
        if missing:
            raise TieraxError(f"a multi-process run needs all of coordinator, process count and process id; "
                              f"missing: {', '.join(missing)}")
        try:
            n, i = int(given[1]), int(given[2])
        except ValueError:
            raise TieraxError(f"{names[1]} and {names[2]} must be integers, got {given[1]!r} and {given[2]!r}") from None
        coord = str(given[0])
        _check(":" in coord and coord.rsplit(":", 1)[1].isdigit(),
               f"{names[0]}={coord!r}: expected HOST:PORT of process 0, e.g. 10.0.0.1:1234")
        _check(n >= 1, f"{names[1]} must be ≥ 1, got {n}")
        _check(0 <= i < n, f"{names[2]}={i} must be in 0..{n - 1} for {n} processes")
        return cls(coord, n, i)


def cpu_devices_per_process(cfg: TrainConfig, num_processes: int = 1) -> int:
    """Host CPU devices each process creates: ``cpu_devices``, else the mesh size over the processes.

    Raises:
      TieraxError: the mesh does not split evenly over processes, or ``cpu_devices``
        contradicts the mesh.
    """
    size = cfg.mesh.size
    if cfg.cpu_devices is not None:
        _check(cfg.cpu_devices * num_processes == size,
               f"{cfg.source}: mesh data×fsdp = {size} devices, but cpu_devices={cfg.cpu_devices} × "
               f"{num_processes} process(es) = {cfg.cpu_devices * num_processes}; make them equal "
               "(or leave cpu_devices unset)")
        return cfg.cpu_devices
    _check(size % num_processes == 0,
           f"{cfg.source}: mesh data×fsdp = {size} devices does not split over {num_processes} processes; "
           f"use a multiple of {num_processes}")
    return size // num_processes
